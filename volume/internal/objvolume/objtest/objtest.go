// Package objtest is what the tests of the configMap, secret and projected
// volume plugins share: a fake of the node's object cache, the objects
// they put in it, a recorder of the steps a plugin takes, and readers of a
// volume as a container sees it. Imported by tests only.
package objtest

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

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume"
)

// The test pod's UID and namespace.
const (
	UID = types.UID("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
	NS  = "ns"
)

// Objects is the object cache of the tests: the ConfigMaps and Secrets
// put, found by a named Ref, and the ClusterTrustBundles, found by name
// or selected as the cache selects them; not found for the others, as the
// cache answers. Set its fields before the plugin reads it.
type Objects struct {
	mu      sync.Mutex
	objs    map[objectcache.Ref]runtime.Object
	Bundles []*certificatesv1.ClusterTrustBundle
	// Listed are the selecting Refs listed.
	Listed []objectcache.Ref
	// Err, when set, is answered for every Get.
	Err error
}

// Get implements the plugins' Objects.
func (f *Objects) Get(_ context.Context, ref objectcache.Ref) (runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return nil, f.Err
	}
	if ref.Kind == objectcache.ClusterTrustBundle {
		for _, b := range f.Bundles {
			if b.Name == ref.Name {
				return b, nil
			}
		}
	}
	if o, ok := f.objs[ref]; ok {
		return o, nil
	}
	return nil, fmt.Errorf("reading %s: %w", ref, apierrors.NewNotFound(v1.Resource(strings.ToLower(string(ref.Kind))+"s"), ref.Name))
}

// List implements the projected plugin's Objects: the bundles ref
// selects.
func (f *Objects) List(_ context.Context, ref objectcache.Ref) ([]runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Listed = append(f.Listed, ref)
	fs, err := fields.ParseSelector(ref.Fields)
	if err != nil {
		return nil, err
	}
	ls, err := labels.Parse(ref.Labels)
	if err != nil {
		return nil, err
	}
	var out []runtime.Object
	for _, b := range f.Bundles {
		if ls.Matches(labels.Set(b.Labels)) && fs.Matches(fields.Set{"spec.signerName": b.Spec.SignerName}) {
			out = append(out, b)
		}
	}
	return out, nil
}

// Put stores obj (a ConfigMap or a Secret of NS) under its name.
func (f *Objects) Put(obj runtime.Object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objs == nil {
		f.objs = map[objectcache.Ref]runtime.Object{}
	}
	switch o := obj.(type) {
	case *v1.ConfigMap:
		f.objs[objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: NS, Name: o.Name}] = o
	case *v1.Secret:
		f.objs[objectcache.Ref{Kind: objectcache.Secret, Namespace: NS, Name: o.Name}] = o
	default:
		panic(fmt.Sprintf("objtest: cannot put a %T", obj))
	}
}

// ConfigMap is ConfigMap name of NS with data and binary data.
func ConfigMap(name string, data map[string]string, binary map[string][]byte) *v1.ConfigMap {
	cm := &v1.ConfigMap{Data: data, BinaryData: binary}
	cm.Namespace, cm.Name = NS, name
	return cm
}

// Secret is Secret name of NS with data.
func Secret(name string, data map[string]string) *v1.Secret {
	s := &v1.Secret{Data: map[string][]byte{}}
	s.Namespace, s.Name = NS, name
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// Steps records the steps a plugin takes (its Config.Steps is Take).
type Steps struct {
	mu    sync.Mutex
	steps []step.Step
}

// Take records s.
func (r *Steps) Take(s step.Step) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, s)
	return nil
}

// Taken returns the steps taken since the last call.
func (r *Steps) Taken() []step.Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.steps
	r.steps = nil
	return s
}

// ReadVolume returns what a container sees in dir: each file by its path
// through the user-visible links, as "mode:uid:gid:content" (uid and gid
// -1 unless withOwner).
func ReadVolume(t testing.TB, dir string, withOwner bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			readPath(t, dir, e.Name(), withOwner, out)
		}
	}
	return out
}

func readPath(t testing.TB, dir, rel string, withOwner bool, out map[string]string) {
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
			readPath(t, dir, filepath.Join(rel, e.Name()), withOwner, out)
		}
		return
	}
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := -1, -1
	if withOwner {
		st := fi.Sys().(*syscall.Stat_t)
		uid, gid = int(st.Uid), int(st.Gid)
	}
	out[rel] = fmt.Sprintf("%#o:%d:%d:%s", fi.Mode().Perm(), uid, gid, data)
}

// DataTarget is where dir's ..data points.
func DataTarget(t testing.TB, dir string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	return target
}

// Exists reports whether p exists (a link is not followed).
func Exists(t testing.TB, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// Env is a plugin of objvolume's shape (configMap, secret) on a temporary
// root, with the fake objects, recording its steps.
type Env struct {
	volume.Plugin
	Root    string
	Mounter mount.Interface
	Objs    *Objects
	Steps   *Steps
}

// NewEnv makes the plugin newPlugin returns (the package's New) on root
// (empty: a new temporary directory) with mounter m, the node's
// allocatable memory 8Gi.
func NewEnv(t testing.TB, root string, m mount.Interface, newPlugin func(objvolume.Config) (volume.Plugin, error)) *Env {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	e := &Env{Root: root, Mounter: m, Objs: &Objects{}, Steps: &Steps{}}
	p, err := newPlugin(objvolume.Config{RootDir: root, Mounter: m, Objects: e.Objs,
		AllocatableMemory: func() (int64, error) { return 8 << 30, nil }, Steps: e.Steps.Take})
	if err != nil {
		t.Fatal(err)
	}
	e.Plugin = p
	return e
}

// Pod is pod NS/pod of UID with one container "c", whose memory limit is
// memLimit (none when empty).
func Pod(memLimit string) *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	if memLimit != "" {
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(memLimit)}
	}
	p.Namespace, p.Name, p.UID = NS, "pod", UID
	return p
}

// Spec is the spec the volume manager gives Pod("64Mi")'s volume name of
// source src, resolved.
func (e *Env) Spec(t testing.TB, name string, src v1.VolumeSource) *podvol.VolumeSpec {
	t.Helper()
	s := &podvol.VolumeSpec{Name: podvol.UniqueVolumeName(e.Name() + "/" + string(UID) + "-" + name), Plugin: e.Name(),
		Mode: podvol.Filesystem, Ephemeral: true, Source: &src}
	if err := e.Plugin.(volume.SpecResolver).ResolveSpec(Pod("64Mi"), s); err != nil {
		t.Fatalf("ResolveSpec: %v", err)
	}
	return s
}

// Request is the volume manager's request for the test pod's volume name.
func Request(spec *podvol.VolumeSpec, name string, fsGroup *int64) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: podvol.PodVolume{
		Pod: podvol.PodRef{UID: UID, Namespace: NS, Name: "pod"}, SpecName: name, FSGroup: fsGroup}}
}

// Dir is the directory of the test pod's volume name.
func (e *Env) Dir(name string) string {
	return filepath.Join(e.Root, "pods", string(UID), "volumes", strings.ReplaceAll(e.Name(), "/", "~"), name)
}
