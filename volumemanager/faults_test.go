package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestPublishHangs: a driver whose NodePublishVolume hangs. While it hangs,
// the wait errors say that the call is still running (not a bare deadline,
// and not the earlier attempt's error) and the pod counts as possibly
// mounted. Once the pod is deleted and the call returns (released, or cut
// off by the call timeout), the target is still unpublished and nothing of
// the pod is left.
func TestPublishHangs(t *testing.T) {
	tests := []struct {
		name string
		// callTimeout is the plugin's CSI call timeout; 0: the default
		// (2 minutes), longer than the test.
		callTimeout time.Duration
		// release ends the hung call by closing its Block; otherwise the
		// call timeout ends it.
		release bool
	}{
		{name: "released", release: true},
		// Long enough that the short waits below end while the call
		// still hangs, even on a busy machine.
		{name: "call timeout", callTimeout: 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{callTimeout: tc.callTimeout})
			e.claim("vol")
			// The first publish fails, so that an earlier error is on record;
			// the retry hangs.
			e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-vol", Err: status.Error(codes.Internal, "no luck"), Times: 1})
			block := make(chan struct{})
			released := false
			release := func() {
				if !released {
					released = true
					close(block)
				}
			}
			defer release()
			e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-vol", Block: block, Times: 1})
			pod := csitest.Pod("ns", "p", csitest.WithPVC("data", "vol", false))
			e.vm.AddPod(pod)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := e.drv.WaitForCalls(ctx, "NodePublishVolume", 2); err != nil {
				t.Fatal(err)
			}

			err := waitShort(ctx, func(ctx context.Context) error { return e.vm.WaitForAttachAndMount(ctx, pod) })
			checkRunning(t, "WaitForAttachAndMount", err, "unmounted volumes=[data]")
			if !e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
				t.Fatal("a hung NodePublishVolume is not counted as possibly mounted")
			}

			e.vm.DeletePod(pod)
			err = waitShort(ctx, func(ctx context.Context) error { return e.vm.WaitForUnmount(ctx, pod) })
			checkRunning(t, "WaitForUnmount", err, "volumes still mounted=[data]")
			if !e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
				t.Fatal("a hung NodePublishVolume of a deleted pod is not counted as possibly mounted")
			}

			if tc.release {
				release()
			}
			if err := e.vm.WaitForUnmount(ctx, pod); err != nil {
				t.Fatal(err)
			}
			if e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
				t.Fatal("the pod still has possibly mounted volumes")
			}
			if got := e.drv.Published("handle-vol"); len(got) != 0 {
				t.Fatalf("still published at %v", got)
			}
			// The recording: the target of the hung publish is unpublished
			// after it, and last.
			var target string
			var last string
			for _, r := range e.drv.Requests() {
				switch req := r.Req.(type) {
				case *csi.NodePublishVolumeRequest:
					target, last = req.GetTargetPath(), r.Method
				case *csi.NodeUnpublishVolumeRequest:
					if req.GetTargetPath() != target {
						t.Errorf("NodeUnpublishVolume of %s, want %s", req.GetTargetPath(), target)
					}
					last = r.Method
				}
			}
			if last != "NodeUnpublishVolume" {
				t.Fatalf("last call on the target %s is %s, want NodeUnpublishVolume", target, last)
			}
		})
	}
}

// waitShort runs a wait with a context that ends soon, for a wait that must
// time out.
func waitShort(ctx context.Context, wait func(context.Context) error) error {
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	return wait(short)
}

// checkRunning checks that err is a *WaitError that says what is waited
// for and that volume "data"'s NodePublishVolume is still running.
func checkRunning(t *testing.T, what string, err error, waited string) {
	t.Helper()
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s = %v (%T), want a *WaitError wrapping the deadline", what, err, err)
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	for _, want := range []string{waited, `volume "data": NodePublishVolume still running after `} {
		if !strings.Contains(msg, want) {
			t.Errorf("%s = %q, does not say %q", what, msg, want)
		}
	}
	if strings.Contains(msg, "with no error reported") {
		t.Errorf("%s = %q, a bare deadline", what, msg)
	}
}
