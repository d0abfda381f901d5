package blockdev

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// TestVerify: Map.Verify refuses a symlink at or above each of a map's
// paths under the root, and accepts a device outside the root, an empty
// device path and paths that do not exist yet.
func TestVerify(t *testing.T) {
	for _, tt := range []struct {
		name string
		link func(m Map) string // "" for none
		edit func(m *Map, t *testing.T)
		want error
	}{
		{name: "nothing made yet"},
		{name: "no device path", edit: func(m *Map, _ *testing.T) { m.DevicePath = "" }},
		{name: "device outside the root", edit: func(m *Map, t *testing.T) { m.DevicePath = filepath.Join(t.TempDir(), "disk") }},
		{name: "device path", link: func(m Map) string { return m.DevicePath }, want: rootfs.ErrSymlink},
		{name: "global map path", link: func(m Map) string { return m.GlobalMapPath }, want: rootfs.ErrSymlink},
		{name: "map file", link: func(m Map) string { return m.mapFile() }, want: rootfs.ErrSymlink},
		{name: "pod device directory", link: func(m Map) string { return m.PodDeviceDir }, want: rootfs.ErrSymlink},
		{name: "above the pod device directory", link: func(m Map) string { return filepath.Dir(m.PodDeviceDir) }, want: rootfs.ErrSymlink},
		{name: "paths outside the root", edit: func(m *Map, _ *testing.T) { m.GlobalMapPath = "/tmp/x" }, want: rootfs.ErrOutside},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := confined(t)
			m := f.m
			if tt.edit != nil {
				tt.edit(&m, t)
			}
			if tt.link != nil {
				link := tt.link(m)
				if err := os.RemoveAll(link); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(t.TempDir(), link); err != nil {
					t.Fatal(err)
				}
			}
			err := m.Verify(f.mp.Root)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}
