package emptydir

import (
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

const testUID = types.UID("11111111-2222-3333-4444-555555555555")

// testPlugin is a plugin on a temporary root and a fake mounter, with
// noswap on, recording the steps it takes.
type testPlugin struct {
	*plugin
	fake  *mount.FakeMounter
	steps []step.Step
}

func newTestPlugin(t *testing.T, alloc func() (int64, error)) *testPlugin {
	t.Helper()
	tp := &testPlugin{fake: mount.NewFakeMounter(nil)}
	p, err := newPlugin(Config{RootDir: t.TempDir(), Mounter: tp.fake, AllocatableMemory: alloc,
		Steps: func(s step.Step) error { tp.steps = append(tp.steps, s); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	p.noswap = func() bool { return true }
	tp.plugin = p
	return tp
}

// spec is the pod-scoped spec of emptyDir name with source src, resolved
// for pod (nil: not resolved).
func (tp *testPlugin) spec(t *testing.T, pod *v1.Pod, name string, src v1.EmptyDirVolumeSource) *podvol.VolumeSpec {
	t.Helper()
	s := &podvol.VolumeSpec{Name: volumeName(testUID, name), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true,
		Source: &v1.VolumeSource{EmptyDir: &src}}
	if pod != nil {
		if err := tp.ResolveSpec(pod, s); err != nil {
			t.Fatalf("ResolveSpec: %v", err)
		}
	}
	return s
}

func request(spec *podvol.VolumeSpec, name string) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: testUID, Namespace: "ns", Name: "pod"}, SpecName: name}}
}

// volumeDir and readyPath are volume name's paths under tp's root.
func (tp *testPlugin) volumeDir(name string) string {
	return filepath.Join(tp.root, "pods", string(testUID), "volumes", escapedName, name)
}

func (tp *testPlugin) readyPath(name string) string {
	return filepath.Join(tp.root, "pods", string(testUID), "plugins", escapedName, name, readyFile)
}

func testPod(containers ...v1.Container) *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{Containers: containers}}
	p.Namespace, p.Name, p.UID = "ns", "pod", testUID
	return p
}

// ctr is a container with the given limits and requests ("memory=1Gi").
func ctr(limits, requests v1.ResourceList) v1.Container {
	return v1.Container{Name: "c", Resources: v1.ResourceRequirements{Limits: limits, Requests: requests}}
}

func mem(q string) v1.ResourceList {
	return v1.ResourceList{v1.ResourceMemory: resource.MustParse(q)}
}

func quantity(q string) *resource.Quantity {
	v := resource.MustParse(q)
	return &v
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// cacheSpecWithoutSource is a spec as reconstruction gives it.
var cacheSpecWithoutSource = podvol.VolumeSpec{Name: volumeName(testUID, "v"), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true}

// volumeName is the unique name of testUID's emptyDir specName.
func volumeName(pod types.UID, specName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(PluginName + "/" + string(pod) + "-" + specName)
}
