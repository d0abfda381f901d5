package volumemanager

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestReportVolumesInUse: with ReportVolumesInUse, a volume that needs
// attaching is not confirmed attached (nor staged) before the Node's
// status.volumesInUse lists it; once the Node can be patched it is
// reported, mounted, and after the pod goes and the volume is unstaged,
// no longer reported.
func TestReportVolumesInUse(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", drv.DriverName(), "handle-a")
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), true), pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	var refuse atomic.Bool
	refuse.Store(true)
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{})
	if _, err := csitest.AttachVolume(ctx, client, pv, node); err != nil { // the attach/detach controller's part
		t.Fatal(err)
	}
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ReportVolumesInUse: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.WithPVC("data", "a", false))
	vm.AddPod(pod)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = vm.WaitForAttachAndMount(short, pod)
	stop()
	if err == nil {
		t.Fatal("mounted before the volume was reported in use")
	}
	// The wait error says what the volume waits for and why it has not
	// happened: the failed report (not a bare deadline).
	for _, want := range []string{`volume "data"`, "status.volumesInUse", "API server unavailable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("WaitForAttachAndMount = %v; want it to say %q", err, want)
		}
	}
	if n := drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("NodeStageVolume called %d times before the volume was reported in use", n)
	}

	refuse.Store(false) // the retry reports it, and the mount proceeds
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	name := cache.CSIVolumeName(drv.DriverName(), "handle-a")
	if got := volumesInUse(t, client); !slices.Equal(got, []v1.UniqueVolumeName{v1.UniqueVolumeName(name)}) {
		t.Errorf("Node volumesInUse = %v, want [%s]", got, name)
	}

	vm.DeletePod(pod)
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volume no longer reported in use", func() bool { return len(volumesInUse(t, client)) == 0 && len(vm.GetVolumesInUse()) == 0 })
}

func volumesInUse(t *testing.T, client *fake.Clientset) []v1.UniqueVolumeName {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.VolumesInUse
}
