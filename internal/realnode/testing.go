package realnode

import (
	"context"
	"os"
	"testing"

	"github.com/nodevol/nodevol/internal/roottest"
)

// StartT starts a runtime for t with the busybox and pause images and
// opts.Images, in a fresh directory below /tmp (short, for the socket)
// unless opts.Dir is set, and stops it when t ends, failing t if anything
// was left. It skips t when not root or under -short (roottest.Require);
// as root, packages missing fail t (make deps installs them).
func StartT(t testing.TB, opts Options) *Runtime {
	t.Helper()
	roottest.Require(t)
	if m := Missing(); m != "" {
		t.Fatalf("a real node needs the packages %s: run make deps as root", m)
	}
	ctx := context.Background()
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "rn-")
		if err != nil {
			t.Fatal(err)
		}
		opts.Dir = dir
	}
	busybox, err := Busybox(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	pause, err := Pause(ctx, opts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	opts.Images = append([]Image{busybox, pause}, opts.Images...)
	r, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return r
}
