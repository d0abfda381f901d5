package du

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// opener opens directories by path, calling before first.
type opener struct{ before func() }

func (o opener) OpenDir(name string) (*os.File, error) {
	if o.before != nil {
		o.before()
	}
	return os.Open(name)
}

func write(t testing.TB, path string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCache: what is kept, what is not.
func TestCache(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// run measures dir twice through c, changing things between, and
		// returns the two figures.
		run      func(t *testing.T, c *Cache, dir string) (first, second int64)
		measured bool // the second call measured again
	}{
		{name: "kept", run: func(t *testing.T, c *Cache, dir string) (int64, int64) {
			a := used(t, c, opener{}, dir)
			write(t, filepath.Join(dir, "more"), 50_000)
			return a, used(t, c, opener{}, dir)
		}},
		{name: "forgotten", measured: true, run: func(t *testing.T, c *Cache, dir string) (int64, int64) {
			a := used(t, c, opener{}, dir)
			write(t, filepath.Join(dir, "more"), 50_000)
			c.Forget(dir)
			return a, used(t, c, opener{}, dir)
		}},
		{name: "another path forgotten", run: func(t *testing.T, c *Cache, dir string) (int64, int64) {
			a := used(t, c, opener{}, dir)
			write(t, filepath.Join(dir, "more"), 50_000)
			c.Forget(dir + "-other")
			return a, used(t, c, opener{}, dir)
		}},
		// A write (Forget) while a measurement runs: what it saw may be
		// older than the write, so it is not kept.
		{name: "forgotten during the measurement", measured: true, run: func(t *testing.T, c *Cache, dir string) (int64, int64) {
			a := used(t, c, opener{before: func() { c.Forget(dir) }}, dir)
			write(t, filepath.Join(dir, "more"), 50_000)
			return a, used(t, c, opener{}, dir)
		}},
		{name: "a failure not kept", measured: true, run: func(t *testing.T, c *Cache, dir string) (int64, int64) {
			if _, err := c.Stats(ctx, failing{}, dir); err == nil {
				t.Fatal("Stats through a failing opener: no error")
			}
			a := used(t, c, opener{}, dir)
			c.Forget(dir)
			write(t, filepath.Join(dir, "more"), 50_000)
			return a, used(t, c, opener{}, dir)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "a"), 10_000)
			first, second := tc.run(t, &Cache{}, dir)
			if measured := second >= first+50_000; measured != tc.measured {
				t.Errorf("UsedBytes %d then %d: measured again %v, want %v", first, second, measured, tc.measured)
			}
		})
	}
}

// failing is an Opener that fails.
type failing struct{}

func (failing) OpenDir(name string) (*os.File, error) {
	return nil, fmt.Errorf("open %s: %w", name, errors.ErrUnsupported)
}

func used(t testing.TB, c *Cache, o Opener, dir string) int64 {
	t.Helper()
	s, err := c.Stats(context.Background(), o, dir)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return s.UsedBytes
}

// TestMeasureCanceled: a canceled walk is an error, not a figure.
func TestMeasureCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	if _, err := Measure(ctx, opener{}, dir); !errors.Is(err, context.Canceled) {
		t.Errorf("Measure: %v, want context.Canceled", err)
	}
}

// configMapVolume lays out what the atomic writer leaves for a configMap
// of n keys of size bytes each: ..data -> ..{timestamp}/ with the files,
// and a symlink per key at the top.
func configMapVolume(b *testing.B, dir string, n, size int) {
	ts := filepath.Join(dir, "..2026_11_30_02_36_16.000000001")
	for i := range n {
		name := fmt.Sprintf("key-%d", i)
		write(b, filepath.Join(ts, name), size)
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkConfigMapVolume is the cost of the usage of a typical
// configMap volume (5 keys of 1 KiB), walked as the kubelet walks it at
// its first stats call after each set-up, and answered from the cache
// after that; through the root (openat2 from the kubelet root), as the
// plugins open it.
func BenchmarkConfigMapVolume(b *testing.B) {
	root := b.TempDir()
	dir := filepath.Join(root, "pods/uid/volumes/kubernetes.io~configmap/config")
	configMapVolume(b, dir, 5, 1024)
	r, err := rootfs.New(root)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("walk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Measure(ctx, r, dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		var c Cache
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Stats(ctx, r, dir); err != nil {
				b.Fatal(err)
			}
		}
	})
}
