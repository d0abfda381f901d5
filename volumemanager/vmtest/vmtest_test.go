package vmtest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestEnvAttachRequired: with an attach-required driver, a pod's claim is
// mounted without the test creating any VolumeAttachment: the env's fake
// attacher creates it (the attach/detach controller's name and spec) and
// attaches it, and its metadata reaches NodeStageVolume as the publish
// context. After the test's DeletePod the volume is unpublished and
// unstaged.
func TestEnvAttachRequired(t *testing.T) {
	env, pv, pod, ctx := mountClaimPod(t, EnvOptions{
		AttachRequired: true,
		Attacher:       csitest.AttacherOptions{Metadata: map[string]string{"devicePath": "/dev/fake"}},
	})
	vaName := csiplugin.AttachmentName(pv.Spec.CSI.VolumeHandle, pv.Spec.CSI.Driver, env.Node)
	va, err := env.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the env's attacher created no VolumeAttachment %s: %v", vaName, err)
	}
	if !va.Status.Attached || va.Spec.NodeName != env.Node || va.Spec.Attacher != csitest.DefaultDriverName {
		t.Errorf("VolumeAttachment %+v", va)
	}
	var stage *csi.NodeStageVolumeRequest
	for _, r := range env.Driver.Requests() {
		if r.Method == "NodeStageVolume" {
			stage = r.Req.(*csi.NodeStageVolumeRequest)
		}
	}
	if stage == nil || stage.GetVolumeId() != "handle-1" || stage.GetPublishContext()["devicePath"] != "/dev/fake" {
		t.Errorf("NodeStageVolume request %v, want volume handle-1 with the attachment's metadata", stage)
	}
	if got := env.Driver.PublishedVolumes()["handle-1"]; len(got) != 1 {
		t.Errorf("handle-1 published at %v, want one target", got)
	}
	name := podvol.CSIVolumeName(csitest.DefaultDriverName, "handle-1")
	if !env.Manager.VolumeIsAttached(name) {
		t.Error("VolumeIsAttached = false for the mounted volume")
	}

	env.Manager.DeletePod(pod)
	if err := env.Manager.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := env.Driver.PublishedVolumes(); len(got) != 0 {
		t.Errorf("published volumes after DeletePod: %v", got)
	}
}

// mountClaimPod starts an env with opts and the bound claim ns/data of
// the volume handle-1 (pv), and mounts the pod ns/web that uses it. ctx
// ends with the test, or after 10 s.
func mountClaimPod(t *testing.T, opts EnvOptions) (*Env, *v1.PersistentVolume, *v1.Pod, context.Context) {
	t.Helper()
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: csitest.DefaultDriverName, Handle: "handle-1"})
	opts.Objects = append(opts.Objects, pvc, pv)
	env := NewEnv(t, opts)
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	env.Manager.AddPod(pod)
	if err := env.Manager.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return env, pv, pod, ctx
}

// TestEnvConfigure: EnvOptions.Configure changes the Config before New,
// and Env.Config is what the manager was made with.
func TestEnvConfigure(t *testing.T) {
	env := NewEnv(t, EnvOptions{Configure: func(c *volumemanager.Config) { c.MountTimeout = 7 * time.Second }})
	if env.Config.MountTimeout != 7*time.Second || env.Config.RootDir != env.RootDir || env.Config.NodeName != csitest.DefaultNodeID {
		t.Errorf("Config = %+v", env.Config)
	}
	if _, err := env.Client.CoreV1().Nodes().Get(context.Background(), env.Node, metav1.GetOptions{}); err != nil {
		t.Errorf("the env's Node: %v", err)
	}
}

// TestFake: the fake records every call with its pods and volumes, and
// answers what the test set.
func TestFake(t *testing.T) {
	a, b := podvol.UniqueVolumeName("kubernetes.io/csi/d^b"), podvol.UniqueVolumeName("kubernetes.io/csi/d^a")
	f := NewFake(a, b)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{})
	ctx := context.Background()
	if err := f.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Errorf("WaitForAttachAndMount = %v, want nil by default", err)
	}
	boom := errors.New("boom")
	f.Set(func(a *FakeAnswers) { a.WaitForAttachAndMountError, a.WaitForUnmountError = boom, boom })
	if err := f.WaitForAttachAndMount(ctx, pod); !errors.Is(err, boom) {
		t.Errorf("WaitForAttachAndMount = %v, want boom", err)
	}
	if err := f.WaitForAllPodsUnmount(ctx, []*v1.Pod{pod, csitest.Pod("ns", "q", csitest.PodSpec{})}); !errors.Is(err, boom) {
		t.Errorf("WaitForAllPodsUnmount = %v, want boom", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.WaitForUnmount(done, pod); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForUnmount on a done context = %v", err)
	}
	mv := podvol.MountedVolume{Name: a, SpecName: "data", State: podvol.Mounted}
	f.Set(func(ans *FakeAnswers) { ans.Mounted[pod.UID] = []podvol.MountedVolume{mv} })
	if got := f.GetPossiblyMountedVolumesForPod(pod.UID); len(got) != 1 || got[0] != mv {
		t.Errorf("possibly mounted = %v, want the mounted volume", got)
	}
	f.Set(func(ans *FakeAnswers) {
		ans.PossiblyMounted[pod.UID] = []podvol.MountedVolume{mv, {Name: b, State: podvol.Uncertain}}
	})
	if got := f.GetPossiblyMountedVolumesForPod(pod.UID); len(got) != 2 {
		t.Errorf("possibly mounted = %v, want two", got)
	}
	if got := f.GetMountedVolumesForPod(pod.UID); len(got) != 1 {
		t.Errorf("mounted = %v, want one", got)
	}
	f.Set(func(ans *FakeAnswers) { ans.ExtraSupplementalGroups[pod.UID] = []int64{1000} })
	if got := f.GetExtraSupplementalGroupsForPod(pod); !slices.Equal(got, []int64{1000}) {
		t.Errorf("groups = %v", got)
	}
	if got := f.GetVolumesInUse(); !slices.Equal(got, []podvol.UniqueVolumeName{b, a}) {
		t.Errorf("volumes in use = %v, want NewFake's, sorted", got)
	}
	f.Set(func(ans *FakeAnswers) { ans.Attached[a] = true })
	if !f.VolumeIsAttached(a) || f.VolumeIsAttached(b) {
		t.Error("VolumeIsAttached does not answer what Attached says")
	}
	if !f.ReconcilerStatesHasBeenSynced() {
		t.Error("ReconcilerStatesHasBeenSynced = false by default")
	}
	f.Set(func(ans *FakeAnswers) { ans.StatesNotSynced = true })
	if f.ReconcilerStatesHasBeenSynced() {
		t.Error("ReconcilerStatesHasBeenSynced = true with StatesNotSynced")
	}
	f.MarkVolumesAsReportedInUse([]podvol.UniqueVolumeName{a, b})
	if c := f.Calls(); !slices.Equal(c[len(c)-1].Volumes, []podvol.UniqueVolumeName{a, b}) {
		t.Errorf("reported = %v, want the volumes MarkVolumesAsReportedInUse was given", c[len(c)-1])
	}
	f.MarkPodsSynced()

	var methods []string
	for _, c := range f.Calls() {
		methods = append(methods, c.Method)
	}
	want := []string{"WaitForAttachAndMount", "WaitForAttachAndMount", "WaitForAllPodsUnmount", "WaitForUnmount",
		"GetPossiblyMountedVolumesForPod", "GetPossiblyMountedVolumesForPod", "GetMountedVolumesForPod",
		"GetExtraSupplementalGroupsForPod", "GetVolumesInUse", "VolumeIsAttached", "VolumeIsAttached",
		"ReconcilerStatesHasBeenSynced", "ReconcilerStatesHasBeenSynced", "MarkVolumesAsReportedInUse", "MarkPodsSynced"}
	if !slices.Equal(methods, want) {
		t.Errorf("calls\n%v\nwant\n%v", methods, want)
	}
	if c := f.Calls()[2]; !slices.Equal(c.Pods, []types.UID{pod.UID, csitest.Pod("ns", "q", csitest.PodSpec{}).UID}) {
		t.Errorf("WaitForAllPodsUnmount recorded pods %v", c.Pods)
	}

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- f.Run(runCtx) }()
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run = %v", err)
	}
}
