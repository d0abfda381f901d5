package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager"
	"github.com/nodevol/nodevol/volumemanager/vmtest"
)

// now is an after that fires at once, recording the delays asked for.
func now(delays *[]time.Duration) func(time.Duration) <-chan time.Time {
	return func(d time.Duration) <-chan time.Time {
		*delays = append(*delays, d)
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
}

// TestPodGone: a pod deleted from the API has its volumes unmounted and
// then its directory removed, on a running VolumeManager.
func TestPodGone(t *testing.T) {
	ctx := t.Context()
	env := vmtest.NewEnv(t, vmtest.EnvOptions{})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "cache", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}})
	if err := env.Manager.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	if err := env.Manager.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(env.RootDir, "pods", string(pod.UID))
	if _, err := os.Stat(podDir); err != nil {
		t.Fatal(err)
	}
	var delays []time.Duration
	podGone(ctx, env.Manager, pod, podDirRetry{first: time.Second, last: time.Minute, after: now(&delays)})
	if _, err := os.Lstat(podDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod directory left: %v", err)
	}
	if len(env.Manager.GetPossiblyMountedVolumesForPod(pod.UID)) != 0 {
		t.Fatal("volumes left")
	}
}

// fakeDirs answers CleanupPodDir with errs, one per call, then nil.
type fakeDirs struct {
	deleted bool
	errs    []error
	calls   int
}

func (f *fakeDirs) DeletePod(*v1.Pod)                             { f.deleted = true }
func (f *fakeDirs) WaitForUnmount(context.Context, *v1.Pod) error { return nil }
func (f *fakeDirs) CleanupPodDir(context.Context, types.UID) error {
	f.calls++
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

// TestPodGoneRetries: while the manager says the directory may be in use,
// podGone asks again, the delay doubling to its cap; what it kept ends it.
func TestPodGoneRetries(t *testing.T) {
	inUse := fmt.Errorf("x: %w", volumemanager.ErrPodDirInUse)
	kept := fmt.Errorf("x: %w", volumemanager.ErrPodDirNotOurs)
	tests := []struct {
		name       string
		errs       []error
		wantCalls  int
		wantDelays []time.Duration
	}{
		{"removed at once", nil, 1, nil},
		{"in use, then removed", []error{inUse, inUse, inUse, inUse}, 5, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}},
		{"kept: not asked again", []error{kept, inUse}, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeDirs{errs: tt.errs}
			var delays []time.Duration
			podGone(t.Context(), f, csitest.Pod("ns", "p", csitest.PodSpec{}), podDirRetry{first: time.Second, last: 5 * time.Second, after: now(&delays)})
			if !f.deleted || f.calls != tt.wantCalls || fmt.Sprint(delays) != fmt.Sprint(tt.wantDelays) {
				t.Errorf("deleted %v, %d calls, delays %v; want %d calls, delays %v", f.deleted, f.calls, delays, tt.wantCalls, tt.wantDelays)
			}
		})
	}
}

// recordingDirs records the pods whose directories podGone removes.
type recordingDirs struct {
	mu      sync.Mutex
	cleaned map[types.UID]bool
	done    chan struct{}
}

func (f *recordingDirs) DeletePod(*v1.Pod)                             {}
func (f *recordingDirs) WaitForUnmount(context.Context, *v1.Pod) error { return nil }
func (f *recordingDirs) CleanupPodDir(_ context.Context, uid types.UID) error {
	f.mu.Lock()
	f.cleaned[uid] = true
	f.mu.Unlock()
	f.done <- struct{}{}
	return nil
}

// TestSweepOrphans: at start, the directory of every pod the API does not
// have (deleted while the agent was down) is removed through podGone, and
// no known pod's, nor a file's.
func TestSweepOrphans(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"pods/gone-1", "pods/running", "pods/gone-2"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "pods", "not-a-pod"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f := &recordingDirs{cleaned: map[types.UID]bool{}, done: make(chan struct{})}
	known := func(uid types.UID) bool { return uid == "running" }
	started := sweepOrphans(t.Context(), f, root, known, defaultPodDirRetry)
	if want := []types.UID{"gone-1", "gone-2"}; !slices.Equal(started, want) {
		t.Fatalf("pods removed %v, want %v", started, want)
	}
	for range started {
		<-f.done
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := map[types.UID]bool{"gone-1": true, "gone-2": true}; !maps.Equal(f.cleaned, want) {
		t.Errorf("directories removed %v, want %v", f.cleaned, want)
	}

	// No pods directory yet (a first start): nothing to do.
	if started := sweepOrphans(t.Context(), f, t.TempDir(), known, defaultPodDirRetry); len(started) != 0 {
		t.Errorf("pods removed with no pods directory: %v", started)
	}
}
