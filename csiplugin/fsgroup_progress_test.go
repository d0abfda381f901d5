package csiplugin

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/volume"
)

// TestPermissionChangeInProgressEvent: an fsGroup ownership change that
// runs past 30 seconds (a fake clock; the walk is held on its first file)
// records a VolumePermissionChangeInProgress event on the pod, not before,
// then one a minute with the files done so far, in the kubelet's words
// (the volume's directory from the pod's UID on); a quick change records
// none and leaves no timer behind.
func TestPermissionChangeInProgressEvent(t *testing.T) {
	driver := csitest.CSIDriver(drv, csitest.CSIDriverSpec{FSGroupPolicy: storagev1.FileFSGroupPolicy})
	gid := int64(os.Getgid())
	setUp := func(t *testing.T, hold bool) (*env, *clocktesting.FakeClock, *record.FakeRecorder, chan string, chan struct{}, chan error) {
		e := newEnv(t, envOptions{objects: []runtime.Object{driver}, driver: csitest.Options{NoStageUnstage: true, CreateTargetDirs: true}})
		clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		rec := record.NewFakeRecorder(10)
		e.p.ownership.Clock, e.p.ownership.Events = clk, rec
		entered, release := make(chan string, 1), make(chan struct{})
		if hold {
			var once sync.Once
			e.p.ownership.EachFile = func(path string) { once.Do(func() { entered <- path; <-release }) }
		}
		vol := podVolume("a", "data")
		vol.FSGroup = &gid
		errc := make(chan error, 1)
		go func() {
			_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: vol, ChangeOwnership: ownership(t, e)})
			errc <- err
		}()
		return e, clk, rec, entered, release, errc
	}
	noEvent := func(t *testing.T, rec *record.FakeRecorder) {
		t.Helper()
		select {
		case ev := <-rec.Events:
			t.Errorf("unexpected event %q", ev)
		default:
		}
	}

	t.Run("long", func(t *testing.T) {
		e, clk, rec, entered, release, errc := setUp(t, true)
		var path string
		select {
		case path = <-entered:
		case err := <-errc:
			t.Fatalf("SetUp returned %v before changing any ownership", err)
		}
		if want := filepath.Join(e.root, "pods", "uid-a", "volumes", "kubernetes.io~csi", "pv-1", "mount"); path != want {
			t.Fatalf("first file owned: %s, want the volume's root %s (it is empty)", path, want)
		}
		// The timer was armed before the walk began.
		if !clk.HasWaiters() {
			t.Fatal("no timer armed for the ownership change")
		}
		clk.Step(fsgroup.DefaultWarnAfter - time.Nanosecond)
		if !clk.HasWaiters() {
			t.Fatal("the timer fired before 30s")
		}
		clk.Step(time.Nanosecond)
		next := func(want string) {
			t.Helper()
			select {
			case ev := <-rec.Events:
				if ev != want {
					t.Errorf("event = %q\nwant    %q", ev, want)
				}
			case err := <-errc:
				t.Fatalf("SetUp returned %v while its walk was held", err)
			}
		}
		next("Warning VolumePermissionChangeInProgress Setting volume ownership for uid-a/volumes/kubernetes.io~csi/pv-1/mount is taking longer than expected, " +
			"consider using OnRootMismatch - https://kubernetes.io/docs/tasks/configure-pod-container/security-context/#configure-volume-permission-and-ownership-change-policy-for-pods")
		for range 2 {
			waitWaiters(t, clk)
			clk.Step(fsgroup.DefaultReportEvery)
			next("Warning VolumePermissionChangeInProgress Setting volume ownership for uid-a/volumes/kubernetes.io~csi/pv-1/mount, processed 1 files.")
		}
		close(release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		noEvent(t, rec)
	})

	t.Run("quick", func(t *testing.T) {
		_, clk, rec, _, _, errc := setUp(t, false)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		noEvent(t, rec)
		if clk.HasWaiters() {
			t.Error("the timer of a finished ownership change is still armed")
		}
	})
}

// waitWaiters waits until something waits on clk: the reporter's next
// timer, armed after its event.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("no timer armed for the next report")
		}
		time.Sleep(time.Millisecond)
	}
}
