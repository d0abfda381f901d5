package configmap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/util/step"
	"github.com/nodevol/nodevol/volume"
)

const (
	testUID = types.UID("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
	testNS  = "ns"
)

// fakeObjects is the object cache of the tests: the ConfigMaps put, and
// not found for the others, as the cache answers.
type fakeObjects struct {
	mu   sync.Mutex
	objs map[objectcache.Ref]runtime.Object
	err  error // answered for every Get when set
}

func (f *fakeObjects) Get(_ context.Context, ref objectcache.Ref) (runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if o, ok := f.objs[ref]; ok {
		return o, nil
	}
	return nil, fmt.Errorf("reading %s: %w", ref, apierrors.NewNotFound(v1.Resource("configmaps"), ref.Name))
}

// put stores cm (in testNS) under its name.
func (f *fakeObjects) put(cm *v1.ConfigMap) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objs == nil {
		f.objs = map[objectcache.Ref]runtime.Object{}
	}
	f.objs[objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: testNS, Name: cm.Name}] = cm
}

// configMapOf is ConfigMap name with data and binary data.
func configMapOf(name string, data map[string]string, binary map[string][]byte) *v1.ConfigMap {
	cm := &v1.ConfigMap{Data: data, BinaryData: binary}
	cm.Namespace, cm.Name = testNS, name
	return cm
}

// env is a plugin on a temporary root, with the fake objects, recording
// its steps.
type env struct {
	volume.Plugin
	root    string
	mounter mount.Interface
	objs    *fakeObjects
	mu      sync.Mutex
	steps   []step.Step
}

func newEnv(t *testing.T, root string, m mount.Interface) *env {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	e := &env{root: root, mounter: m, objs: &fakeObjects{}}
	p, err := New(Config{RootDir: root, Mounter: m, Objects: e.objs,
		AllocatableMemory: func() (int64, error) { return 8 << 30, nil },
		Steps: func(s step.Step) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.steps = append(e.steps, s)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.Plugin = p
	return e
}

// takeSteps returns the steps taken since the last call.
func (e *env) takeSteps() []step.Step {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.steps
	e.steps = nil
	return s
}

func testPod(memLimit string) *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	if memLimit != "" {
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(memLimit)}
	}
	p.Namespace, p.Name, p.UID = testNS, "pod", testUID
	return p
}

// spec is the spec the volume manager gives pod volume name, resolved.
func (e *env) spec(t *testing.T, name string, src v1.ConfigMapVolumeSource) *cache.VolumeSpec {
	t.Helper()
	s := &cache.VolumeSpec{Name: cache.UniqueVolumeName(PluginName + "/" + string(testUID) + "-" + name), Plugin: PluginName,
		Mode: cache.Filesystem, Ephemeral: true, Source: &v1.VolumeSource{ConfigMap: &src}}
	if err := e.Plugin.(volume.SpecResolver).ResolveSpec(testPod("64Mi"), s); err != nil {
		t.Fatalf("ResolveSpec: %v", err)
	}
	return s
}

func request(spec *cache.VolumeSpec, name string, fsGroup *int64) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: cache.PodVolume{
		Pod: cache.PodRef{UID: testUID, Namespace: testNS, Name: "pod"}, SpecName: name, FSGroup: fsGroup}}
}

// dir is the directory of pod volume name.
func (e *env) dir(name string) string {
	return filepath.Join(e.root, "pods", string(testUID), "volumes", "kubernetes.io~configmap", name)
}

// readVolume returns what a container sees in dir: each file by its path
// through the user-visible links, as "mode:gid:content" (gid -1: not
// checked).
func readVolume(t *testing.T, dir string, withGID bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") {
			continue
		}
		readPath(t, dir, e.Name(), withGID, out)
	}
	return out
}

func readPath(t *testing.T, dir, rel string, withGID bool, out map[string]string) {
	t.Helper()
	full := filepath.Join(dir, rel)
	fi, err := os.Stat(full)
	if err != nil {
		t.Fatal(err)
	}
	if fi.IsDir() {
		entries, err := os.ReadDir(full)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			readPath(t, dir, filepath.Join(rel, e.Name()), withGID, out)
		}
		return
	}
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	gid := -1
	if withGID {
		gid = int(fi.Sys().(*syscall.Stat_t).Gid)
	}
	out[rel] = fmt.Sprintf("%#o:%d:%s", fi.Mode().Perm(), gid, data)
}

// dataTarget is where dir's ..data points.
func dataTarget(t *testing.T, dir string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	return target
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func ptr[T any](v T) *T { return &v }
