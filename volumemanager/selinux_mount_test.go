package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
)

const (
	levelA   = "s0:c1,c2"
	contextA = "system_u:object_r:container_file_t:s0:c1,c2"
	levelB   = "s0:c3,c4"
	contextB = "system_u:object_r:container_file_t:s0:c3,c4"
)

// seLinuxPod is a pod mounting claim as volume "data", with the pod-level
// SELinux level (none when empty).
func seLinuxPod(name, claim, level string) *v1.Pod {
	pod := csitest.Pod("ns", name, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
	if level != "" {
		pod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: level}}
	}
	return pod
}

// seLinuxVM starts a volume manager on root with the driver registered and
// SELinux on the host as enabled says.
func seLinuxVM(t *testing.T, client *fake.Clientset, root string, drv *csitest.Server, enabled bool, events record.EventRecorder) (*VolumeManager, func()) {
	t.Helper()
	return startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil),
		EventRecorder: events, SELinuxEnabled: func() bool { return enabled }}, drv)
}

// mountFlags returns the mount_flags of every request of method, in order.
func mountFlags(drv *csitest.Server, method string) [][]string {
	var out [][]string
	for _, r := range drv.Requests() {
		if r.Method != method {
			continue
		}
		switch req := r.Req.(type) {
		case *csi.NodeStageVolumeRequest:
			out = append(out, req.GetVolumeCapability().GetMount().GetMountFlags())
		case *csi.NodePublishVolumeRequest:
			out = append(out, req.GetVolumeCapability().GetMount().GetMountFlags())
		}
	}
	return out
}

func readVolDataText(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ondisk.VolumeDataFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSELinuxMountOptions: NodeStageVolume and NodePublishVolume get
// context="<label>" after the PV's mount options, and both vol_data.json
// files record it, and GetMountedVolumesForPod reports it, exactly when
// the kubelet 1.37 mounts with it: SELinux on the host, the CSIDriver's
// seLinuxMount, a PV of any access mode, a label on the pod and no
// Recursive change policy.
func TestSELinuxMountOptions(t *testing.T) {
	recursive := v1.SELinuxChangePolicyRecursive
	mountOption := v1.SELinuxChangePolicyMountOption
	for _, tc := range []struct {
		name        string
		hostOff     bool
		noDriverOpt bool
		modes       []v1.PersistentVolumeAccessMode
		level       string
		policy      *v1.PodSELinuxChangePolicy
		container   *v1.SELinuxOptions
		want        string
	}{
		{name: "context", level: levelA, want: contextA},
		{name: "MountOption policy", level: levelA, policy: &mountOption, want: contextA},
		{name: "container's own label", container: &v1.SELinuxOptions{Level: levelB}, level: levelA, want: contextB},
		{name: "host without SELinux", hostOff: true, level: levelA},
		{name: "driver without seLinuxMount", noDriverOpt: true, level: levelA},
		{name: "pod without label"},
		{name: "Recursive policy", level: levelA, policy: &recursive},
		{name: "ReadWriteOnce volume", level: levelA, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, want: contextA},
		{name: "ReadWriteMany volume", level: levelA, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, want: contextA},
		{name: "ReadOnlyMany volume", level: levelA, modes: []v1.PersistentVolumeAccessMode{v1.ReadOnlyMany}, want: contextA},
		{name: "ReadWriteOncePod among others", level: levelA, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod, v1.ReadWriteOnce}, want: contextA},
		{name: "ReadWriteMany volume, Recursive policy", level: levelA, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, policy: &recursive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
			modes := tc.modes
			if modes == nil {
				modes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}
			}
			pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a", AccessModes: modes, MountOptions: []string{"noatime"}})
			client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{SELinuxMount: !tc.noDriverOpt}), pvc, pv)
			root := t.TempDir()
			vm, stop := seLinuxVM(t, client, root, drv, !tc.hostOff, nil)
			defer stop()
			pod := seLinuxPod("p", "a", tc.level)
			if tc.policy != nil {
				pod.Spec.SecurityContext.SELinuxChangePolicy = tc.policy
			}
			if tc.container != nil {
				pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SELinuxOptions: tc.container}
			}
			vm.AddPod(pod)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
				t.Fatal(err)
			}

			flags := []string{"noatime"}
			ctxKey := ""
			if tc.want != "" {
				flags = append(flags, `context="`+tc.want+`"`)
				ctxKey = `,"seLinuxMountContext":"` + tc.want + `"`
			}
			for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
				if got := mountFlags(drv, m); !reflect.DeepEqual(got, [][]string{flags}) {
					t.Errorf("%s mount_flags = %q, want %q", m, got, flags)
				}
			}
			stagingDir, _ := ondisk.StagingDir(root, drv.DriverName(), "handle-a")
			want := `{"specVolID":"` + pv.Name + `","volumeHandle":"handle-a","driverName":"` + drv.DriverName() + `"` + ctxKey + `}`
			if got := strings.TrimSpace(readVolDataText(t, stagingDir)); got != want {
				t.Errorf("staging vol_data.json = %s, want %s", got, want)
			}
			podDir, _ := ondisk.PodVolumeDir(root, pod.UID, pv.Name)
			want = `{"specVolID":"` + pv.Name + `","volumeHandle":"handle-a","driverName":"` + drv.DriverName() + `","nodeName":"` + node +
				`","attachmentID":"` + csiplugin.AttachmentName("handle-a", drv.DriverName(), node) + `","volumeLifecycleMode":"Persistent"` + ctxKey + `}`
			if got := strings.TrimSpace(readVolDataText(t, podDir)); got != want {
				t.Errorf("pod vol_data.json = %s, want %s", got, want)
			}
			if got := vm.GetMountedVolumesForPod(pod.UID); len(got) != 1 || got[0].SELinuxContext != tc.want {
				t.Errorf("mounted volumes %+v, want one with SELinuxContext %q", got, tc.want)
			}
		})
	}
}

// TestSELinuxConflict: a second pod that would mount a volume with another
// SELinux context is refused with an error naming both pods, the volume
// and both contexts, through its wait error and a FailedMount event; the
// first pod is untouched and nothing is staged again. Once the first pod
// is gone, the volume is unstaged and staged again with the second pod's
// context.
func TestSELinuxConflict(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{
		Driver:      drv.DriverName(),
		Handle:      "handle-a",
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod},
	})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{SELinuxMount: true}), pvc, pv)
	events := record.NewFakeRecorder(100)
	vm, stop := seLinuxVM(t, client, t.TempDir(), drv, true, events)
	defer stop()
	podA, podB := seLinuxPod("a", "a", levelA), seLinuxPod("b", "a", levelB)
	vm.AddPod(podA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, podA); err != nil {
		t.Fatal(err)
	}

	vm.AddPod(podB)
	var event string
	select {
	case event = <-events.Events:
	case <-ctx.Done():
		t.Fatal("no event for the conflict")
	}
	name := "kubernetes.io/csi/" + drv.DriverName() + "^handle-a"
	wantMsg := `conflicting SELinux labels of volume ` + name + ` (driver ` + drv.DriverName() + `): pod ns/b would mount it with SELinux context "` + contextB +
		`", but pod ns/a uses it with SELinux context "` + contextA + `"; a volume is mounted with one context at a time, so pod ns/b waits until the volume is no longer used by pod ns/a`
	// The event in the kubelet's words, the wait error in nodevol's.
	if want := `Warning FailedMount conflicting SELinux labels of volume ` + pv.Name + `: "` + contextA + `" and "` + contextB + `"`; event != want {
		t.Errorf("event:\n%s\nwant\n%s", event, want)
	}
	// A refusal is final: the wait returns with it as soon as the loop has
	// set it (the event is recorded just before).
	err := vm.WaitForAttachAndMount(ctx, podB)
	var we *WaitError
	var conflict *SELinuxConflictError
	if !errors.Is(err, ErrFinal) || !errors.As(err, &we) || !errors.As(we.Causes["data"], &conflict) {
		t.Fatalf("wait error %v, want a WaitError caused by an SELinuxConflictError", err)
	}
	if conflict.Pod.Name != "b" || conflict.Other.Name != "a" || conflict.Context != contextB || conflict.OtherContext != contextA {
		t.Errorf("conflict %+v", conflict)
	}
	if want := `pod ns/b: unmounted volumes=[data]; volume "data": ` + wantMsg; err.Error() != want {
		t.Errorf("wait error:\n%s\nwant\n%s", err, want)
	}
	waitIdle(t, vm)
	if n, m := drv.Calls("NodeStageVolume"), drv.Calls("NodePublishVolume"); n != 1 || m != 1 {
		t.Errorf("NodeStageVolume %d, NodePublishVolume %d times, want once each (pod a only)", n, m)
	}
	if got := vm.GetMountedVolumesForPod(podA.UID); len(got) != 1 {
		t.Errorf("pod a's volumes: %+v, want its one volume mounted", got)
	}
	if got := drv.Calls("NodeUnpublishVolume") + drv.Calls("NodeUnstageVolume"); got != 0 {
		t.Errorf("%d teardown calls, want none", got)
	}
	select {
	case e := <-events.Events:
		t.Errorf("a second event: %s", e)
	default:
	}

	drv.Reset()
	vm.DeletePod(podA)
	if err := vm.WaitForUnmount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	// The refusal is final while it lasts (ErrFinal): wait for the loop
	// to have planned pod b without pod a before asking again.
	waitIdle(t, vm)
	if err := vm.WaitForAttachAndMount(ctx, podB); err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, r := range drv.Requests() {
		methods = append(methods, r.Method)
	}
	if want := []string{"NodeUnpublishVolume", "NodeUnstageVolume", "NodeStageVolume", "NodePublishVolume"}; !slices.Equal(methods, want) {
		t.Errorf("calls after pod a went: %v, want %v", methods, want)
	}
	flags := [][]string{{`context="` + contextB + `"`}}
	for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
		if got := mountFlags(drv, m); !reflect.DeepEqual(got, flags) {
			t.Errorf("%s mount_flags = %q, want %q", m, got, flags)
		}
	}
}

// TestSELinuxContextRestored: after a restart the contexts come back from
// vol_data.json, so the pod that mounted the volume mounts it again with
// its context (no conflict with itself, no unstage), and another pod still
// conflicts with it.
func TestSELinuxContextRestored(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{
		Driver:      drv.DriverName(),
		Handle:      "handle-a",
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod},
	})
	client := fake.NewClientset([]runtime.Object{csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{SELinuxMount: true}), pvc, pv}...)
	root := t.TempDir()
	podA, podB := seLinuxPod("a", "a", levelA), seLinuxPod("b", "a", levelB)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	vm1, stop1 := seLinuxVM(t, client, root, drv, true, nil)
	vm1.AddPod(podA)
	if err := vm1.WaitForAttachAndMount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	stop1()

	drv.Reset()
	events := record.NewFakeRecorder(100)
	vm2, stop2 := seLinuxVM(t, client, root, drv, true, events)
	defer stop2()
	// Pod a first, mounted again before pod b comes: which refusal pod b
	// gets depends on what it is admitted against: pod a in the desired
	// state gives the SELinux conflict; pod a's mount found on disk alone
	// (pod b resolved first, the object cache's answer to their claim
	// coming between the two) gives ReadWriteOncePod. So does the kubelet,
	// whose populator adds pods in its own order.
	vm2.AddPod(podA)
	if err := vm2.WaitForAttachAndMount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	vm2.AddPod(podB)
	vm2.MarkPodsSynced()
	select {
	case e := <-events.Events:
		if want := `Warning FailedMount conflicting SELinux labels of volume ` + pv.Name + `: "` + contextA + `" and "` + contextB + `"`; e != want {
			t.Errorf("event %q, want pod b's conflict with pod a: %q", e, want)
		}
	case <-ctx.Done():
		t.Fatal("no event for pod b's conflict")
	}
	waitIdle(t, vm2)
	var methods []string
	for _, r := range drv.Requests() {
		if strings.HasPrefix(r.Method, "Node") && r.Method != "NodeGetCapabilities" && r.Method != "NodeGetInfo" {
			methods = append(methods, r.Method)
		}
	}
	if want := []string{"NodeStageVolume", "NodePublishVolume"}; !slices.Equal(methods, want) {
		t.Errorf("node calls after the restart: %v, want %v (pod a's uncertain mounts again)", methods, want)
	}
	flags := [][]string{{`context="` + contextA + `"`}}
	for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
		if got := mountFlags(drv, m); !reflect.DeepEqual(got, flags) {
			t.Errorf("%s mount_flags after the restart = %q, want %q", m, got, flags)
		}
	}
	if got := vm2.GetMountedVolumesForPod(podB.UID); len(got) != 0 {
		t.Errorf("pod b mounted %+v despite the conflict", got)
	}
}
