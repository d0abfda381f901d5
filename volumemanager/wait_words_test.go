package volumemanager

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/emptydir"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// blockingMounter is a fake mounter whose mounts wait until release is
// closed: a tmpfs that takes long to mount.
type blockingMounter struct {
	*mount.FakeMounter
	release chan struct{}
}

func (m blockingMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	<-m.release
	return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
}

// TestWaitErrorNamesTheStep: a wait error that says what still runs uses
// the plugin's own words: the kubelet's step ("MountVolume.SetUp") for an
// emptyDir whose set-up hangs, never a CSI call it does not make.
func TestWaitErrorNamesTheStep(t *testing.T) {
	m := blockingMounter{FakeMounter: mount.NewFakeMounter(nil), release: make(chan struct{})}
	vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), Mounter: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	defer close(m.release)
	pod := csitest.Pod("ns", "p", csitest.WithVolume(v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{
		EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}}, false))
	vm.AddPod(pod)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = vm.WaitForAttachAndMount(short, pod)
	stop()
	if err == nil || !strings.Contains(err.Error(), `volume "scratch": MountVolume.SetUp still running after`) || strings.Contains(err.Error(), "NodePublishVolume") {
		t.Fatalf("WaitForAttachAndMount = %v; want it to say the emptyDir's MountVolume.SetUp still runs", err)
	}
}

// namedPlugin names its calls (volume.CallNamer), except its attach.
type namedPlugin struct{ nfsPlugin }

func (p *namedPlugin) CallName(m volume.Method, _ *podvol.VolumeSpec) string {
	if m == volume.MethodWaitForAttach {
		return ""
	}
	return "Named" + string(m)
}

// TestCallName: an operation is described by its plugin's name for the
// call where the plugin gives one, else by the kubelet's words for the
// step, raw block ones for a block volume.
func TestCallName(t *testing.T) {
	ed, err := emptydir.New(emptydir.Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := volume.NewRegistry(ed, &namedPlugin{nfsPlugin{name: "example.com/named"}})
	if err != nil {
		t.Fatal(err)
	}
	empty, named := podvol.UniqueVolumeName(emptydir.PluginName+"/uid-scratch"), podvol.UniqueVolumeName("example.com/named/vol")
	for _, tc := range []struct {
		kind   oe.OpKind
		volume podvol.UniqueVolumeName
		mode   podvol.VolumeMode
		want   string
	}{
		{oe.OpPublish, empty, podvol.Filesystem, "MountVolume.SetUp"},
		{oe.OpUnpublish, empty, podvol.Filesystem, "UnmountVolume.TearDown"},
		{oe.OpPublish, named, podvol.Filesystem, "NamedSetUp"},
		{oe.OpUnstage, named, podvol.Filesystem, "NamedUnmountDevice"},
		{oe.OpAttach, named, podvol.Filesystem, "MountVolume.WaitForAttach"},
		{oe.OpAttach, named, podvol.Block, "MapVolume.WaitForAttach"},
		{oe.OpPublish, "example.com/unknown/vol", podvol.Block, "MapVolume.MapPodDevice"},
	} {
		spec := podvol.VolumeSpec{Name: tc.volume, Mode: tc.mode}
		if got := callName(plugins, oe.Action{Kind: tc.kind, Volume: tc.volume}, &spec); got != tc.want {
			t.Errorf("callName(%s of %s, %s) = %q, want %q", tc.kind, tc.volume, tc.mode, got, tc.want)
		}
	}
}
