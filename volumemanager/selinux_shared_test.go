package volumemanager

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// seLinuxMetricNames are the kubelet's volume_manager_selinux_* families.
var seLinuxMetricNames = []string{
	"volume_manager_selinux_container_errors_total",
	"volume_manager_selinux_container_warnings_total",
	"volume_manager_selinux_pod_context_mismatch_errors_total",
	"volume_manager_selinux_pod_context_mismatch_warnings_total",
	"volume_manager_selinux_volume_context_mismatch_errors_total",
	"volume_manager_selinux_volume_context_mismatch_warnings_total",
	"volume_manager_selinux_volumes_admitted_total",
}

// seLinuxMetricsVM starts a volume manager on an SELinux host whose
// metrics go to a registry of their own.
func seLinuxMetricsVM(t *testing.T, client *fake.Clientset, drv *csitest.Server) (*VolumeManager, *prometheus.Registry, func()) {
	t.Helper()
	reg := prometheus.NewRegistry()
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil),
		Registerer: reg, SELinuxEnabled: func() bool { return true }}, drv)
	return vm, reg, stop
}

// TestSELinuxSharedVolume: pods sharing a ReadWriteMany volume, as the
// kubelet 1.37 handles them: pods with the same label share one staging
// mounted with their context; a pod with another label, and a Recursive
// pod (which mounts with none), wait with an SELinuxConflictError, and
// each refusal counts volume_context_mismatch_errors_total; the volume is
// counted admitted once.
func TestSELinuxSharedVolume(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{SELinuxMount: true}), pvc, pv)
	vm, reg, stop := seLinuxMetricsVM(t, client, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	podA, podB := seLinuxPod("a", "a", levelA), seLinuxPod("b", "a", levelA)
	for _, p := range []*v1.Pod{podA, podB} {
		vm.AddPod(p)
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if n := drv.Calls("NodeStageVolume"); n != 1 {
		t.Errorf("NodeStageVolume %d times, want once for both pods", n)
	}
	want := [][]string{{`context="` + contextA + `"`}, {`context="` + contextA + `"`}}
	if got := mountFlags(drv, "NodePublishVolume"); !reflect.DeepEqual(got, want) {
		t.Errorf("NodePublishVolume mount_flags = %q, want %q", got, want)
	}

	recursive := v1.SELinuxChangePolicyRecursive
	podC, podD := seLinuxPod("c", "a", levelB), seLinuxPod("d", "a", levelA)
	podD.Spec.SecurityContext.SELinuxChangePolicy = &recursive
	for _, tc := range []struct {
		pod     *v1.Pod
		context string
	}{{podC, contextB}, {podD, ""}} {
		vm.AddPod(tc.pod)
		err := vm.WaitForAttachAndMount(ctx, tc.pod)
		var we *WaitError
		var conflict *SELinuxConflictError
		if !errors.Is(err, ErrFinal) || !errors.As(err, &we) || !errors.As(we.Causes["data"], &conflict) {
			t.Fatalf("pod %s: wait error %v, want a final SELinuxConflictError", tc.pod.Name, err)
		}
		if conflict.Pod.Name != tc.pod.Name || conflict.Context != tc.context || conflict.OtherContext != contextA {
			t.Errorf("pod %s: conflict %+v, want its context %q against %q", tc.pod.Name, conflict, tc.context, contextA)
		}
	}
	waitIdle(t, vm)
	if n := drv.Calls("NodePublishVolume"); n != 2 {
		t.Errorf("NodePublishVolume %d times, want 2 (pods a and b only)", n)
	}
	plugin := `volume_plugin="kubernetes.io/csi/` + drv.DriverName() + `"`
	wantMetrics := strings.Join([]string{
		`volume_manager_selinux_volume_context_mismatch_errors_total{access_mode="RWX",` + plugin + `} 2`,
		`volume_manager_selinux_volumes_admitted_total{access_mode="RWX",` + plugin + `} 1`,
	}, "\n")
	if got := samples(t, reg, seLinuxMetricNames...); got != wantMetrics {
		t.Errorf("metrics:\n%s\nwant\n%s", got, wantMetrics)
	}
}

// TestSELinuxContainersDisagree: containers of one pod with different
// labels on a PV (of any access mode) make the pod wait and count
// pod_context_mismatch_errors_total; on an inline CSI volume they are a
// warning (pod_context_mismatch_warnings_total) and the volume is mounted
// with no context. An inline volume of a driver that mounts with a
// context is counted admitted, yet mounted with none.
func TestSELinuxContainersDisagree(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{
		SELinuxMount:   true,
		LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
	}), pvc, pv)
	vm, reg, stop := seLinuxMetricsVM(t, client, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	disagree := func(p *v1.Pod) *v1.Pod {
		p.Spec.Containers = append(p.Spec.Containers, *p.Spec.Containers[0].DeepCopy())
		p.Spec.Containers[1].Name += "-2"
		p.Spec.Containers[1].SecurityContext = &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelB}}
		return p
	}

	claimPod := disagree(seLinuxPod("claim", "a", levelA))
	vm.AddPod(claimPod)
	// The error may resolve (a pod update), so the wait would go on: a
	// wait that has already ended reports the pod's errors as they are,
	// once the resolution that counted the metric has stored them.
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	var err error
	eventually(t, "the PV's pod counted and its error reported", func() bool {
		err = vm.WaitForAttachAndMount(done, claimPod)
		return strings.Contains(samples(t, reg, seLinuxMetricNames...), "pod_context_mismatch_errors_total") &&
			err != nil && strings.Contains(err.Error(), "different SELinux labels")
	})
	if err == nil || errors.Is(err, ErrFinal) || !strings.Contains(err.Error(), "the containers that mount it have different SELinux labels") {
		t.Fatalf("pod on a PV: wait error %v, want the containers' labels, not final", err)
	}

	inlinePod := disagree(csitest.Pod("ns", "inline", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: drv.DriverName()}}},
	}}))
	inlinePod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelA}}
	labelled := csitest.Pod("ns", "labelled", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: drv.DriverName()}}},
	}})
	labelled.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelA}}
	for _, p := range []*v1.Pod{inlinePod, labelled} {
		vm.AddPod(p)
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if got := mountFlags(drv, "NodePublishVolume"); !reflect.DeepEqual(got, [][]string{nil, nil}) {
		t.Errorf("inline NodePublishVolume mount_flags = %q, want none", got)
	}
	if n := drv.Calls("NodeStageVolume"); n != 0 {
		t.Errorf("NodeStageVolume %d times, want none (the PV's pod waits)", n)
	}

	got := samples(t, reg, seLinuxMetricNames...)
	plugin := `volume_plugin="kubernetes.io/csi/` + drv.DriverName() + `"`
	want := `volume_manager_selinux_volumes_admitted_total{access_mode="inline",` + plugin + `} 1`
	if !strings.Contains(got, want+"\n") && !strings.HasSuffix(got, want) {
		t.Errorf("metrics:\n%s\nwant a line %s", got, want)
	}
	// A pod whose containers disagree is counted at each resolution, as the
	// kubelet counts each attempt of its populator: once at least (the
	// inline pod may be resolved again before the metrics are read: a
	// -race run on a loaded machine counted it twice).
	for _, series := range []string{
		`volume_manager_selinux_pod_context_mismatch_warnings_total{access_mode="inline"}`,
		`volume_manager_selinux_pod_context_mismatch_errors_total{access_mode="RWO"}`,
	} {
		if !atLeastOnce(got, series) {
			t.Errorf("metrics:\n%s\nwant %s at 1 or more", got, series)
		}
	}
	if strings.Contains(got, "volume_context_mismatch") || strings.Contains(got, "container_") {
		t.Errorf("metrics:\n%s\nwant no volume or container errors", got)
	}
}

// atLeastOnce reports whether the text exposition metrics has a line for
// series (name and labels) whose value is 1 or more.
func atLeastOnce(metrics, series string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			return err == nil && n >= 1
		}
	}
	return false
}
