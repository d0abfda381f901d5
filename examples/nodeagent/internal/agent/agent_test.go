package agent

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckKubeletRoot: a root directory whose kubelet pod-resources
// socket accepts connections (a kubelet runs on it) is refused; a socket
// that a stopped kubelet left behind, or none, is not.
func TestCheckKubeletRoot(t *testing.T) {
	for _, tt := range []struct {
		name    string
		socket  string // "": none, "live", "stale"
		refused bool
	}{
		{name: "no kubelet", socket: ""},
		{name: "a kubelet that stopped", socket: "stale"},
		{name: "a kubelet running", socket: "live", refused: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, kubeletSocket)
			if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
				t.Fatal(err)
			}
			if tt.socket != "" {
				ln, err := net.Listen("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				if tt.socket == "stale" {
					// Closing a unix listener removes its file: keep it, as
					// a killed kubelet does.
					ln.(*net.UnixListener).SetUnlinkOnClose(false)
					ln.Close()
				} else {
					defer ln.Close()
				}
				if _, err := os.Stat(path); err != nil {
					t.Fatal(err)
				}
			}
			err := checkKubeletRoot(t.Context(), root)
			if (err != nil) != tt.refused {
				t.Errorf("checkKubeletRoot: %v, want refused %v", err, tt.refused)
			}
		})
	}
}
