package kubelettest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCommand builds a command once, gives the same path again, and
// removes it.
func TestCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a command: not under -short")
	}
	c := Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/registrar"}
	path := c.Path(t)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("built %s: %v, mode %v", path, err, fi)
	}
	if again := c.Path(t); again != path {
		t.Errorf("second Path %s, want the first build's %s", again, path)
	}
	c.Remove()
	if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Errorf("Remove left %s: %v", filepath.Dir(path), err)
	}
}
