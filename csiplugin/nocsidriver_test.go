package csiplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestNoCSIDriver: a driver without a CSIDriver object gets the kubelet's
// default for every field the object holds; where the kubelet fails (an
// inline volume) or waits because of a default (the attachment), the
// error names the missing object and what the volume needs it for. Each
// case runs with no CSIDriver and, where the words must not appear, with
// one.
func TestNoCSIDriver(t *testing.T) {
	pv := testSpec(drv)
	inline := &podvol.VolumeSpec{Name: "inline", Driver: drv, VolumeHandle: "csi-inline", Mode: podvol.Filesystem, Ephemeral: true}
	missing := "CSIDriver " + drv + " not found in the API"
	tests := []struct {
		field string
		// check fails the test when the plugin does not behave as the
		// kubelet does without a CSIDriver.
		check func(t *testing.T, e *env)
	}{
		{"attachRequired: attached, and the wait says why", func(t *testing.T, e *env) {
			caps, err := e.p.Capabilities(pv)
			if err != nil || !caps.Attachable {
				t.Errorf("Capabilities = %+v, %v; want attachable", caps, err)
			}
			_, err = e.p.WaitForAttach(context.Background(), pv)
			if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), missing+": without one a volume needs attaching") {
				t.Errorf("WaitForAttach = %v, want ErrNotReady naming the missing CSIDriver", err)
			}
		}},
		{"volumeLifecycleModes: a PV is Persistent", func(t *testing.T, e *env) {
			caps, err := e.p.Capabilities(pv)
			if err != nil || len(caps.LifecycleModes) != 1 || caps.LifecycleModes[0] != storagev1.VolumeLifecyclePersistent {
				t.Errorf("Capabilities = %+v, %v; want Persistent", caps, err)
			}
		}},
		{"volumeLifecycleModes: an inline volume is refused at publish, naming the object", func(t *testing.T, e *env) {
			if caps, err := e.p.Capabilities(inline); err != nil || caps.LifecycleModes != nil {
				t.Errorf("Capabilities = %+v, %v; want no modes (the publish refuses it)", caps, err)
			}
			_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: inline, Volume: podVolume("a", "scratch")})
			want := "volume lifecycle mode Ephemeral not supported by driver " + drv + ": " + missing + " (an inline CSI volume needs one whose volumeLifecycleModes lists Ephemeral"
			if err == nil || !strings.Contains(err.Error(), want) || volume.IsUncertain(err) {
				t.Errorf("SetUp = %v, want a final error saying %q", err, want)
			}
			if n := e.srv.Calls("NodePublishVolume"); n != 0 {
				t.Errorf("%d NodePublishVolume calls, want none", n)
			}
			if _, err := os.Stat(filepath.Join(e.root, "pods")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("SetUp left the pod's directories: %v", err)
			}
		}},
		{"podInfoOnMount and tokenRequests: no pod information, no token", func(t *testing.T, e *env) {
			if _, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: pv, Volume: podVolume("a", "data")}); err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			vc := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest).GetVolumeContext()
			for _, k := range []string{podNameKey, podNamespaceKey, podUIDKey, serviceAccountNameKey, serviceAccountTokensKey} {
				if _, ok := vc[k]; ok {
					t.Errorf("volume context has %s: %v", k, vc)
				}
			}
		}},
		{"requiresRepublish: false", func(t *testing.T, e *env) {
			if caps, err := e.p.Capabilities(pv); err != nil || caps.Republish {
				t.Errorf("Capabilities = %+v, %v; want no republish", caps, err)
			}
		}},
		{"fsGroupPolicy: ReadWriteOnceWithFSType", func(t *testing.T, e *env) {
			gid := int64(1000)
			rwx := *pv
			rwx.AccessMode = "ReadWriteMany"
			noFS := *pv
			noFS.FSType = ""
			for _, c := range []struct {
				spec *podvol.VolumeSpec
				want bool
			}{{pv, true}, {&rwx, false}, {&noFS, false}} {
				if got := needsOwnership(c.spec, podvol.PodVolume{FSGroup: &gid}, csiCaps(t, e), nil); got != c.want {
					t.Errorf("needsOwnership(access %s, fsType %q) = %v, want %v", c.spec.AccessMode, c.spec.FSType, got, c.want)
				}
			}
		}},
		{"nodeAllocatableUpdatePeriodSeconds: an exhausted attach is no attach limit", func(t *testing.T, e *env) {
			va := csitest.VolumeAttachment("va", drv, "pv", testNode, false)
			code := int32(codes.ResourceExhausted)
			va.Status.AttachError = &storagev1.VolumeError{Message: "too many", ErrorCode: &code}
			if attachLimitReached(nil, va) {
				t.Error("attachLimitReached without a CSIDriver = true, want false")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{NoStageUnstage: true, CreateTargetDirs: true}})
			tt.check(t, e)
		})
	}
	// With the object, the wait says nothing of a missing one.
	e := newEnv(t, envOptions{objects: []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{AttachRequired: true})}})
	if _, err := e.p.WaitForAttach(context.Background(), pv); err == nil || strings.Contains(err.Error(), "not found in the API") {
		t.Errorf("WaitForAttach with a CSIDriver = %v, want a wait that does not speak of a missing CSIDriver", err)
	}
}

// csiCaps are the test driver's node capabilities, as registered.
func csiCaps(t *testing.T, e *env) csi.Capabilities {
	t.Helper()
	c, err := e.reg.Client(drv)
	if err != nil {
		t.Fatal(err)
	}
	return c.Capabilities()
}
