package atomicwriter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/internal/steptest"
	"github.com/nodevol/nodevol/step"
)

// visible checks what a reader sees in dir: the version through ..data is
// from (nil: nothing yet) or to in full, and every path of from or to
// reads through its user-visible link as that version has it, or is
// missing only where it is not in both payloads.
func visible(dir string, from, to map[string]File) error {
	var cur map[string]File
	if _, err := os.Lstat(filepath.Join(dir, "..data")); err == nil {
		got := map[string]string{}
		base := filepath.Join(dir, "..data")
		err := filepath.WalkDir(base+"/", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(p)
			got[strings.TrimPrefix(p, base+"/")] = string(data)
			return err
		})
		if err != nil {
			return err
		}
		for _, p := range []map[string]File{from, to} {
			if p != nil && maps.EqualFunc(got, p, func(s string, f File) bool { return s == string(f.Data) }) {
				cur = p
			}
		}
		if cur == nil {
			return fmt.Errorf("..data holds %v: neither version", got)
		}
	}
	for _, p := range []map[string]File{from, to} {
		for name := range p {
			data, err := os.ReadFile(filepath.Join(dir, name))
			_, inFrom := from[name]
			_, inTo := to[name]
			switch {
			case errors.Is(err, fs.ErrNotExist) && (cur == nil || !(inFrom && inTo)):
			case err != nil:
				return fmt.Errorf("%s, in both versions: %w", name, err)
			case cur == nil:
				return fmt.Errorf("%s reads %q before any version", name, data)
			case string(data) != string(cur[name].Data):
				return fmt.Errorf("%s reads %q, not the visible version's", name, data)
			}
		}
	}
	return nil
}

// TestCrash stops a Write at each of its steps in turn: at every step the
// directory shows one version in full, and after the crash the next
// Write converges to exactly what an uninterrupted Write leaves.
func TestCrash(t *testing.T) {
	from := map[string]File{
		"same": {Data: []byte("S"), Mode: 0o644}, "chg": {Data: []byte("1"), Mode: 0o644},
		"old": {Data: []byte("O"), Mode: 0o644}, "d/x": {Data: []byte("X1"), Mode: 0o600},
	}
	to := map[string]File{
		"same": {Data: []byte("S"), Mode: 0o644}, "chg": {Data: []byte("2"), Mode: 0o640},
		"new": {Data: []byte("N"), Mode: 0o644}, "d/x": {Data: []byte("X2"), Mode: 0o600},
		"d/y/z": {Data: []byte("Z"), Mode: 0o644},
	}
	for _, tc := range []struct {
		name string
		from map[string]File
	}{
		{name: "first write"},
		{name: "update", from: from},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// What an uninterrupted Write, and then one more, leave.
			ref := writeTwice(t, tc.from, to)
			steps := 0
			for at := 1; ; at++ {
				root, dir := setup(t)
				if tc.from != nil {
					if _, err := newWriter(t, root, Options{}).Write(context.Background(), tc.from); err != nil {
						t.Fatal(err)
					}
				}
				var seen error
				c := steptest.New(func(step.Step) {
					if err := visible(dir, tc.from, to); err != nil && seen == nil {
						seen = err
					}
				})
				c.Arm(at)
				_, err := newWriter(t, root, Options{Steps: c.Take}).Write(context.Background(), to)
				taken, stop := c.Steps()
				if seen != nil {
					t.Fatalf("crash at %d: a reader saw: %v", at, seen)
				}
				if err := visible(dir, tc.from, to); err != nil {
					t.Fatalf("crash at %d (%v): a reader sees: %v", at, stop, err)
				}
				if stop == nil {
					if err != nil {
						t.Fatalf("Write with no crash: %v", err)
					}
					steps = len(taken)
					break
				}
				if err == nil {
					t.Fatalf("crash at %d (%v): Write succeeded", at, stop)
				}
				w := newWriter(t, root, Options{})
				for range 2 {
					if _, err := w.Write(context.Background(), to); err != nil {
						t.Fatalf("crash at %d (%v), then Write: %v", at, stop, err)
					}
				}
				if got := tree(t, dir); got != ref {
					t.Fatalf("crash at %d (%v), then two Writes:\n%s\nwant:\n%s", at, stop, got, ref)
				}
			}
			if steps < 10 {
				t.Fatalf("a Write took only %d steps", steps)
			}
			t.Logf("crashed at each of %d steps", steps)
		})
	}
}

// writeTwice returns the tree that writing from (if not nil), then to
// twice, leaves.
func writeTwice(t *testing.T, from, to map[string]File) string {
	t.Helper()
	root, dir := setup(t)
	w := newWriter(t, root, Options{})
	for _, p := range []map[string]File{from, to, to} {
		if p == nil {
			continue
		}
		if _, err := w.Write(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	return tree(t, dir)
}
