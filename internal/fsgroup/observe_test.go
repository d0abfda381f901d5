package fsgroup

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestObserver: a change that runs is told to the context's Observer,
// once; one that OnRootMismatch skips (the root already has the group) is
// not, as the kubelet records no volume_apply_access_control for it.
func TestObserver(t *testing.T) {
	gid := int64(os.Getgid())
	if os.Geteuid() == 0 {
		gid = 2000
	}
	dir := filepath.Join(t.TempDir(), "mount")
	tree(t, dir)
	var seen int
	ctx := WithObserver(context.Background(), func(time.Duration, error) { seen++ })
	for i, want := range []int{1, 1} { // the second finds the root done
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		err = Reporter{}.Change(ctx, Request{Dir: d, GID: gid, OnRootMismatch: true})
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		if seen != want {
			t.Errorf("change %d: observed %d changes, want %d", i+1, seen, want)
		}
	}
	Observe(context.Background(), time.Second, nil) // no observer: nothing happens
}
