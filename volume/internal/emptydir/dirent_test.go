package emptydir

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadDir lists a directory larger than one getdents buffer, with a
// file, a directory and a symlink among its entries: every entry once,
// with its type, "." and ".." left out.
func TestReadDir(t *testing.T) {
	dir := t.TempDir()
	var want []string
	for i := range 300 {
		name := fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 60))
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	want = append(want, "d", "l")
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	entries, err := readDir(fd)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.name)
		wantType := map[string]byte{"d": unix.DT_DIR, "l": unix.DT_LNK}[e.name]
		if wantType == 0 {
			wantType = unix.DT_REG
		}
		if e.typ != wantType && e.typ != unix.DT_UNKNOWN {
			t.Errorf("%s: type %d, want %d", e.name, e.typ, wantType)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("got %d entries, want %d", len(got), len(want))
	}
}
