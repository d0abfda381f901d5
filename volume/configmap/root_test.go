package configmap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// TestRootConfigMapUpdate: a reader of the user-visible path (through a
// nested item's directory link and ..data) sees each update whole and in
// order, never an error or an older version after a newer one; after a
// restart the directory is Uncertain, SetUp changes nothing, and TearDown
// leaves nothing.
func TestRootConfigMapUpdate(t *testing.T) {
	roottest.Require(t)
	ctx := context.Background()
	e := newEnv(t, "", mount.New(""))
	const updates = 50
	value := func(v int) string { return strconv.Itoa(v) + ":" + strings.Repeat(strconv.Itoa(v%10), 8192) }
	e.Objs.Put(objtest.ConfigMap("c", map[string]string{"app.yaml": value(0)}, nil))
	spec := e.spec(t, "cfg", v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"},
		Items: []v1.KeyToPath{{Key: "app.yaml", Path: "conf/app.yaml"}}})
	req := objtest.Request(spec, "cfg", nil)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}

	r := startReader(filepath.Join(dir, "conf", "app.yaml"), value)
	for v := 1; v <= updates; v++ {
		r.waitRead(int64(v - 1))
		e.Objs.Put(objtest.ConfigMap("c", map[string]string{"app.yaml": value(v)}, nil))
		if _, err := e.SetUp(ctx, req); err != nil {
			t.Fatal(err)
		}
		r.done.Store(int64(v))
	}
	r.waitRead(updates)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	after := newEnv(t, e.Root, mount.New(""))
	after.Objs.Put(objtest.ConfigMap("c", map[string]string{"app.yaml": value(updates)}, nil))
	found := after.Plugin.(volume.Reconstructor).Reconstruct(ctx, volume.Recovery{MountPoints: map[string]bool{}})
	if len(found.Mounts) != 1 || found.Mounts[0].Spec.Name != spec.Name || found.Mounts[0].State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v, want %s Uncertain", found, spec.Name)
	}
	current := objtest.DataTarget(t, dir)
	if _, err := after.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	// The writer keeps the version an update replaced until its next
	// Write: removing it is all that SetUp does.
	for _, s := range after.Steps.Taken() {
		if s.Op != step.Remove || !strings.HasPrefix(s.Path, filepath.Join(dir, "..")) || strings.HasPrefix(s.Path, filepath.Join(dir, current)) {
			t.Errorf("SetUp after the restart took step %v", s)
		}
	}
	if objtest.DataTarget(t, dir) != current {
		t.Errorf("SetUp after the restart switched ..data")
	}
	if err := after.TearDown(ctx, volume.MountRequest{Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: objtest.UID}, SpecName: "cfg"}}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(dir), filepath.Join(e.Root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir")} {
		if entries, err := os.ReadDir(d); err != nil || len(entries) != 0 {
			t.Fatalf("TearDown left %v in %s (%v)", entries, d, err)
		}
	}
}

// reader reads a file of a volume over and over, checking each read: the
// content whole (value(v) for a version v), the versions in order, none
// older than the last update done when the read started.
type reader struct {
	// done is the last update done, set by the test.
	done atomic.Int64
	// progress gets, after a read, the update done when it started.
	progress chan int64
	stopped  chan struct{}
	result   chan error
}

func startReader(file string, value func(int) string) *reader {
	r := &reader{progress: make(chan int64, 1), stopped: make(chan struct{}), result: make(chan error, 1)}
	go func() {
		last := -1
		for {
			started := r.done.Load()
			data, err := os.ReadFile(file)
			if err != nil {
				r.result <- err
				return
			}
			n, _, _ := strings.Cut(string(data), ":")
			v, err := strconv.Atoi(n)
			if err != nil || string(data) != value(v) || v < last || int64(v) < started {
				r.result <- fmt.Errorf("read %.20q... after update %d, version %d seen before", data, started, last)
				return
			}
			last = v
			select {
			case r.progress <- started:
			default:
			}
			select {
			case <-r.stopped:
				r.result <- nil
				return
			default:
			}
		}
	}()
	return r
}

// waitRead waits for a read started after update v was done: an update
// made after it cannot share a lookup with update v.
func (r *reader) waitRead(v int64) {
	for started := int64(-1); started < v; {
		select {
		case started = <-r.progress:
		case err := <-r.result:
			r.result <- err // the reader failed: stop reports it
			return
		}
	}
}

// stop stops the reader and returns its verdict.
func (r *reader) stop() error {
	close(r.stopped)
	return <-r.result
}
