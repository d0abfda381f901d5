package csitest

import (
	"os"
	"testing"
)

// socketParent is where ShortTempDir makes its directories: "/tmp" and not
// os.TempDir(). A unix socket's path must fit in sun_path (108 bytes with
// its NUL), and $TMPDIR, which os.TempDir() and t.TempDir() follow, can be
// long enough on its own (a CI runner's or a sandbox's work directory) to
// leave too little for the directories and the socket's name below it.
const socketParent = "/tmp"

// ShortTempDir makes a new directory under /tmp whose name starts with
// prefix, for unix sockets and for roots that hold them (a kubelet root
// with plugins_registry, a driver's socket directory). The caller removes
// it; tests use SocketDir, which does. It is for programs and for tests
// that must decide themselves when and whether the directory may go (one
// that may still have mounts under it).
func ShortTempDir(prefix string) (string, error) {
	return os.MkdirTemp(socketParent, prefix)
}

// SocketDir returns a new directory under /tmp for a test's unix sockets
// (see ShortTempDir), removed with everything in it when tb ends. Use it
// instead of tb.TempDir() for any directory a socket is bound in, at any
// depth: t.TempDir() adds $TMPDIR, the test's name and a counter, and
// binding fails with "bind: invalid argument" once the path is too long.
func SocketDir(tb testing.TB) string {
	tb.Helper()
	dir, err := ShortTempDir("nv-")
	if err != nil {
		tb.Fatalf("making a socket directory: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("removing socket directory %s: %v", dir, err)
		}
	})
	return dir
}
