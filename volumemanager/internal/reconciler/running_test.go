package reconciler

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/emptydir"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// TestRunningOps: a pod's volume is explained by the operation on its own
// mount, else by one on the whole volume, never by another pod's.
func TestRunningOps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(uid types.UID) podvol.PodVolume { return podvol.PodVolume{Pod: podvol.PodRef{UID: uid}} }
	var r runningOps
	r.start(oe.Action{Kind: oe.OpPublish, Volume: "v1", Pod: pod("a")}, "NodePublishVolume", t0)
	r.start(oe.Action{Kind: oe.OpStage, Volume: "v2"}, "NodeStageVolume", t0.Add(time.Second))
	r.start(oe.Action{Kind: oe.OpAttach, Volume: "v3"}, "MountVolume.WaitForAttach", t0)
	now := t0.Add(3*time.Second + 1234*time.Microsecond)
	tests := []struct {
		volume podvol.UniqueVolumeName
		uid    types.UID
		want   string
	}{
		{"v1", "a", "NodePublishVolume still running after 3.001s"},
		{"v1", "b", ""},
		{"v2", "a", "NodeStageVolume still running after 2.001s"},
		{"v3", "a", "MountVolume.WaitForAttach still running after 3.001s"},
		{"v4", "a", ""},
	}
	for _, tc := range tests {
		got := ""
		if op, ok := r.of(tc.volume, tc.uid); ok {
			got = op.Describe(now)
		}
		if got != tc.want {
			t.Errorf("of(%s, %s) = %q, want %q", tc.volume, tc.uid, got, tc.want)
		}
	}
	r.done(oe.Action{Kind: oe.OpPublish, Volume: "v1", Pod: pod("a")})
	if op, ok := r.of("v1", "a"); ok {
		t.Errorf("after done: %+v", op)
	}
}

// namedPlugin names its calls (volume.CallNamer), except its attach.
type namedPlugin struct{ name string }

func (p *namedPlugin) Name() string                                        { return p.name }
func (p *namedPlugin) CanSupport(v *v1.Volume) bool                        { return v.NFS != nil }
func (p *namedPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p *namedPlugin) SetUp(context.Context, volume.MountRequest) (string, error) {
	return "", nil
}
func (p *namedPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{}, nil
}

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
	plugins, err := volume.NewRegistry(ed, &namedPlugin{name: "example.com/named"})
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
