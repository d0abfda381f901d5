package atomicwriter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodevol/nodevol/internal/roottest"
)

// owners lists path's mode, owner and group, not following a link.
func owners(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Sprintf("link %d:%d", st.Uid, st.Gid)
	}
	return fmt.Sprintf("%v %d:%d", fi.Mode(), st.Uid, st.Gid)
}

// TestOwnership writes with a pod's fsGroup and a file user (root only:
// chown to another user).
func TestOwnership(t *testing.T) {
	roottest.Require(t)
	root, dir := setup(t)
	w := newWriter(t, root, Options{FSGroup: ptr(int64(2000))})
	payload := map[string]File{
		"token":  {Data: []byte("T"), Mode: 0o600, FSUser: ptr(int64(1000))},
		"ca.crt": {Data: []byte("C"), Mode: 0o644},
		"d/e":    {Data: []byte("E"), Mode: 0o400},
	}
	if changed, err := w.Write(context.Background(), payload); err != nil || !changed {
		t.Fatalf("Write = %v, %v", changed, err)
	}
	for _, tc := range []struct{ path, want string }{
		{".", "dgrwxr-x--- 0:2000"},
		{"..data", "link 0:2000"},
		{"..data/.", "dgrwxr-xr-x 0:2000"},
		{"..data/token", "-rw-r----- 1000:2000"},
		{"..data/ca.crt", "-rw-r--r-- 0:2000"},
		{"..data/d", "dgrwxr-xr-x 0:2000"},
		{"..data/d/e", "-r--r----- 0:2000"},
		{"token", "link 1000:2000"},
		{"ca.crt", "link 0:2000"},
	} {
		if got := owners(t, dir+"/"+tc.path); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.path, got, tc.want)
		}
	}
	if changed, err := w.Write(context.Background(), payload); err != nil || changed {
		t.Fatalf("Write of the same = %v, %v; want unchanged", changed, err)
	}
	// Another owner is another payload.
	payload["token"] = File{Data: []byte("T"), Mode: 0o600, FSUser: ptr(int64(1001))}
	if changed, err := w.Write(context.Background(), payload); err != nil || !changed {
		t.Fatalf("Write with another owner = %v, %v; want changed", changed, err)
	}
	if got := owners(t, filepath.Join(dir, "..data/token")); got != "-rw-r----- 1001:2000" {
		t.Errorf("token: %s", got)
	}
}
