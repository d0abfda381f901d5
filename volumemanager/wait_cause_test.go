package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestWaitErrorNamesCause: a wait that runs out of time on errors that
// may resolve is not final, unwraps to the deadline, and names the cause
// of each volume, never a bare "context deadline exceeded".
func TestWaitErrorNamesCause(t *testing.T) {
	tests := []struct {
		name string
		// node: the Node object exists; inUse: Config.ReportVolumesInUse.
		node, inUse bool
		want        []string
	}{
		{
			name:  "Node object missing, volumes in use reported",
			inUse: true,
			want:  []string{`volume "data": its attachment is confirmed only once node node-1's status.volumesInUse lists it, and reporting it failed: `, `"node-1" not found`},
		},
		{
			name: "attachment not confirmed yet",
			node: true,
			want: []string{`volume "data": verify_controller_attached_volume failed`, "to be attached"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
			pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
			objs := []runtime.Object{csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv}
			if tt.node {
				objs = append(objs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
			}
			client := fake.NewClientset(objs...)
			// A clock that does not move: a failed operation is not retried
			// (its backoff never ends), so that the wait's deadline finds it
			// failed, not running again, however loaded the machine.
			clk := fakeclock.NewFakeClock(time.Now())
			vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ReportVolumesInUse: tt.inUse, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- vm.Run(ctx) }()
			defer func() { cancel(); <-done }()
			if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
				t.Fatal(err)
			}
			pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
			short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
			err = vm.WaitForAttachAndMount(short, pod)
			stop()
			if errors.Is(err, ErrFinal) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitForAttachAndMount = %v, want a timeout, not final", err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("WaitForAttachAndMount = %v\nwant it to say %q", err, want)
				}
			}
		})
	}
}
