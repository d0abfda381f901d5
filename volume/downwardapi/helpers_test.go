package downwardapi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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

func ptr[T any](v T) *T { return &v }

// node is the node's allocatable resources in the tests.
var node = v1.ResourceList{
	v1.ResourceCPU:    resource.MustParse("4"),
	v1.ResourceMemory: resource.MustParse("8Gi"),
}

// testPlugin is a plugin on a temporary root and a fake mounter, recording
// the steps it takes.
type testPlugin struct {
	*plugin
	root  string
	fake  *mount.FakeMounter
	steps []step.Step
}

func newTestPlugin(t *testing.T, alloc func() (v1.ResourceList, error)) *testPlugin {
	t.Helper()
	tp := &testPlugin{fake: mount.NewFakeMounter(nil), root: t.TempDir()}
	p, err := newPlugin(Config{RootDir: tp.root, Mounter: tp.fake, NodeAllocatable: alloc,
		Steps: func(s step.Step) error { tp.steps = append(tp.steps, s); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	tp.plugin = p
	return tp
}

func nodeAlloc() (v1.ResourceList, error) { return node, nil }

// testPod is a pod with one container "app" with a 256Mi memory limit and
// a 250m cpu limit, and labels.
func testPod(labels map[string]string) *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Resources: v1.ResourceRequirements{
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("256Mi"), v1.ResourceCPU: resource.MustParse("250m")},
		Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("256Mi"), v1.ResourceCPU: resource.MustParse("250m")},
	}}}}}
	p.Namespace, p.Name, p.UID, p.Labels = "ns", "pod", testUID, labels
	p.Annotations = map[string]string{"note": "a\nb"}
	return p
}

func field(path, fieldPath string) v1.DownwardAPIVolumeFile {
	return v1.DownwardAPIVolumeFile{Path: path, FieldRef: &v1.ObjectFieldSelector{FieldPath: fieldPath}}
}

func res(path, container, name, divisor string) v1.DownwardAPIVolumeFile {
	return v1.DownwardAPIVolumeFile{Path: path, ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: container, Resource: name, Divisor: resource.MustParse(divisor)}}
}

// unresolved is the pod-scoped spec of downwardAPI volume name with
// source src, as the volume manager builds it.
func unresolved(name string, src v1.DownwardAPIVolumeSource) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: podvol.UniqueVolumeName(PluginName + "/" + string(testUID) + "-" + name), Plugin: PluginName,
		Mode: podvol.Filesystem, Ephemeral: true, Source: &v1.VolumeSource{DownwardAPI: &src}}
}

// resolved is that spec resolved for pod.
func resolved(t *testing.T, p *plugin, pod *v1.Pod, name string, src v1.DownwardAPIVolumeSource) *podvol.VolumeSpec {
	t.Helper()
	s := unresolved(name, src)
	if err := p.ResolveSpec(pod, s); err != nil {
		t.Fatalf("ResolveSpec: %v", err)
	}
	return s
}

func request(spec *podvol.VolumeSpec, name string, fsGroup *int64) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: podvol.PodVolume{
		Pod: podvol.PodRef{UID: testUID, Namespace: "ns", Name: "pod"}, SpecName: name, ReadOnly: true, FSGroup: fsGroup}}
}

// volumeDir and readyPath are volume name's paths under root.
func volumeDir(root, name string) string {
	return filepath.Join(root, "pods", string(testUID), "volumes", "kubernetes.io~downward-api", name)
}

func readyPath(root, name string) string {
	return filepath.Join(root, "pods", string(testUID), "plugins", "kubernetes.io~empty-dir", "wrapped_"+name, "ready")
}

// listing describes what a container sees in dir: each name (".." names
// excepted) with its mode and, for a file reached through its link, its
// content; "->" and the target for a link, sorted.
func listing(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if strings.HasPrefix(rel, "..") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line := rel + " -> " + target
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				line += " " + fi.Mode().Perm().String() + " " + string(data)
			}
			lines = append(lines, line)
			return nil
		}
		lines = append(lines, rel+" "+d.Type().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
