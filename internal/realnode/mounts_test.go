package realnode

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodevol/nodevol/internal/roottest"
)

// TestMountsUnder finds the tmpfs mounted under a directory whose name
// mountinfo escapes, not one beside it, and Unmount takes it away.
func TestMountsUnder(t *testing.T) {
	roottest.Require(t)
	dir := filepath.Join(t.TempDir(), "a root")
	inside, beside := filepath.Join(dir, "vol"), dir+"-beside"
	for _, d := range []string{inside, beside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = syscall.Unmount(beside, syscall.MNT_DETACH)
		_ = syscall.Unmount(inside, syscall.MNT_DETACH)
	})
	ms, err := MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Point != inside || ms[0].FSType != "tmpfs" || ms[0].ID == "" {
		t.Fatalf("MountsUnder(%s) = %+v, want the tmpfs at %s only", dir, ms, inside)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if ms, err := MountsUnder(dir); err != nil || len(ms) != 0 {
		t.Errorf("after Unmount: %+v, %v", ms, err)
	}
}

func TestUnescape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/var/lib/kubelet", "/var/lib/kubelet"},
		{`/mnt/a\040b`, "/mnt/a b"},
		{`/mnt/tab\011x\134y`, "/mnt/tab\tx\\y"},
		{`/mnt/short\04`, `/mnt/short\04`},
		{`/mnt/not\9xx`, `/mnt/not\9xx`},
	} {
		if got := unescape(tc.in); got != tc.want {
			t.Errorf("unescape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
