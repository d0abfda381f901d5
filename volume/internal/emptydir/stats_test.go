package emptydir

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

func TestVolumeStats(t *testing.T) {
	tests := []struct {
		name       string
		fill       func(t *testing.T, dir, outside string)
		wantInodes int64 // the root included
	}{
		{name: "empty", wantInodes: 1},
		{name: "files and directories", wantInodes: 5, fill: func(t *testing.T, dir, _ string) {
			write(t, filepath.Join(dir, "a/b/big"), string(make([]byte, 100_000)))
			write(t, filepath.Join(dir, "small"), "x")
		}},
		{name: "a hard link counted once", wantInodes: 3, fill: func(t *testing.T, dir, _ string) {
			write(t, filepath.Join(dir, "f"), string(make([]byte, 50_000)))
			if err := os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "g")); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "h"), "h")
		}},
		{name: "a symlink counted, not followed", wantInodes: 2, fill: func(t *testing.T, dir, outside string) {
			if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			outside := t.TempDir()
			write(t, filepath.Join(outside, "big"), string(make([]byte, 1_000_000)))
			spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
			dir, err := tp.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.fill != nil {
				tt.fill(t, dir, outside)
			}
			st, ok, err := tp.VolumeStats(context.Background(), spec, dir, "")
			if err != nil || !ok {
				t.Fatalf("VolumeStats: %v, %v", ok, err)
			}
			if st.InodesUsed != tt.wantInodes {
				t.Errorf("InodesUsed %d, want %d", st.InodesUsed, tt.wantInodes)
			}
			if want := duBytes(t, dir); st.UsedBytes != want {
				t.Errorf("UsedBytes %d, want %d", st.UsedBytes, want)
			}
			var sfs unix.Statfs_t
			if err := unix.Statfs(dir, &sfs); err != nil {
				t.Fatal(err)
			}
			if st.CapacityBytes != int64(sfs.Blocks)*int64(sfs.Bsize) || st.Inodes != int64(sfs.Files) {
				t.Errorf("capacity %d, inodes %d; statfs says %d, %d", st.CapacityBytes, st.Inodes, int64(sfs.Blocks)*int64(sfs.Bsize), sfs.Files)
			}
			if st.AvailableBytes <= 0 || st.AvailableBytes > st.CapacityBytes || st.InodesFree <= 0 || st.InodesFree > st.Inodes {
				t.Errorf("available %d of %d bytes, %d of %d inodes free", st.AvailableBytes, st.CapacityBytes, st.InodesFree, st.Inodes)
			}
		})
	}
}

// duBytes is what du counts under dir: 512-byte blocks of each inode once.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	seen := map[uint64]bool{}
	var n int64
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		s := fi.Sys().(*syscall.Stat_t)
		if !seen[s.Ino] {
			seen[s.Ino] = true
			n += s.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestVolumeStatsErrors(t *testing.T) {
	tp := newTestPlugin(t, nil)
	spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
	outside := t.TempDir()
	dir := tp.volumeDir("v")
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"missing": dir, "outside the root": outside} {
		if _, ok, err := tp.VolumeStats(context.Background(), spec, path, ""); err == nil || ok {
			t.Errorf("%s: %v, %v; want an error", name, ok, err)
		}
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.VolumeStats(context.Background(), spec, dir, ""); err == nil {
		t.Error("a symlink as the volume: followed")
	}
}
