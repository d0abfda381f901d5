package du

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStatfs checks that Statfs reports the file system of the open
// directory as statfs(2) does: all blocks as capacity, the unprivileged
// free blocks as available, and the used inodes as the total less the free.
func TestStatfs(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := Statfs(d)
	if err != nil {
		t.Fatalf("Statfs: %v", err)
	}
	var want unix.Statfs_t
	if err := unix.Statfs(dir, &want); err != nil {
		t.Fatal(err)
	}
	if c := int64(want.Blocks) * want.Bsize; got.CapacityBytes != c {
		t.Errorf("CapacityBytes = %d, want %d", got.CapacityBytes, c)
	}
	if got.Inodes != int64(want.Files) {
		t.Errorf("Inodes = %d, want %d", got.Inodes, want.Files)
	}
	if got.InodesUsed != got.Inodes-got.InodesFree {
		t.Errorf("InodesUsed = %d, want Inodes-InodesFree = %d", got.InodesUsed, got.Inodes-got.InodesFree)
	}
	if got.AvailableBytes > got.CapacityBytes || got.UsedBytes > got.CapacityBytes {
		t.Errorf("AvailableBytes %d, UsedBytes %d above CapacityBytes %d", got.AvailableBytes, got.UsedBytes, got.CapacityBytes)
	}
}

// TestStatfsClosed checks that a failed statfs is an error naming the
// directory.
func TestStatfsClosed(t *testing.T) {
	d, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if _, err := Statfs(d); err == nil {
		t.Fatal("Statfs of a closed directory succeeded")
	}
}
