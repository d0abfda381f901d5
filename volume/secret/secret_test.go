package secret

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// setUpCase is a SetUp of TestSetUp and what it should do.
type setUpCase struct {
	name    string
	secret  *v1.Secret // nil: missing
	src     v1.SecretVolumeSource
	fsGroup *int64
	// want maps each path to "mode:gid:content" (gid -1: unchecked).
	want map[string]string
	// wantErr are substrings of the error; nothing is then made.
	wantErr  []string
	kubelet  string // the kubelet's words for the error (volume.EventCause)
	notFound bool
}

// TestSetUp: the files of a secret volume, as the kubelet writes them, on
// a tmpfs sized by the pod; and the errors that leave nothing behind.
func TestSetUp(t *testing.T) {
	gid := int64(os.Getgid())
	for _, tc := range []setUpCase{{
		name:   "every key, the default mode when the spec has none",
		secret: objtest.Secret("s", map[string]string{"user": "admin", "pass": "pw"}),
		src:    v1.SecretVolumeSource{SecretName: "s"},
		want:   map[string]string{"user": "0644:-1:-1:admin", "pass": "0644:-1:-1:pw"},
	}, {
		name:   "defaultMode",
		secret: objtest.Secret("s", map[string]string{"k": "v"}),
		src:    v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o400)},
		want:   map[string]string{"k": "0400:-1:-1:v"},
	}, {
		name:   "items: only their keys, at their paths, with their modes",
		secret: objtest.Secret("s", map[string]string{"a": "A", "b": "B", "c": "C"}),
		src: v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o440), Items: []v1.KeyToPath{
			{Key: "a", Path: "dir/sub/a.txt"}, {Key: "b", Path: "b", Mode: ptr[int32](0o600)}}},
		want: map[string]string{"dir/sub/a.txt": "0440:-1:-1:A", "b": "0600:-1:-1:B"},
	}, {
		name:    "fsGroup: the group owns every file, with group read",
		secret:  objtest.Secret("s", map[string]string{"a": "A", "b": "B"}),
		src:     v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o400), Items: []v1.KeyToPath{{Key: "a", Path: "x/a"}, {Key: "b", Path: "b", Mode: ptr[int32](0o600)}}},
		fsGroup: &gid,
		want:    map[string]string{"x/a": fmt.Sprintf("0440:%d:%d:A", os.Getuid(), gid), "b": fmt.Sprintf("0640:%d:%d:B", os.Getuid(), gid)},
	}, {
		name: "optional and missing: an empty volume",
		src:  v1.SecretVolumeSource{SecretName: "s", Optional: ptr(true)},
		want: map[string]string{},
	}, {
		name:   "optional: an item whose key is missing is skipped",
		secret: objtest.Secret("s", map[string]string{"a": "A"}),
		src:    v1.SecretVolumeSource{SecretName: "s", Optional: ptr(true), Items: []v1.KeyToPath{{Key: "a", Path: "a"}, {Key: "gone", Path: "g"}}},
		want:   map[string]string{"a": "0644:-1:-1:A"},
	}, {
		name:     "missing: the kubelet's error",
		src:      v1.SecretVolumeSource{SecretName: "s"},
		wantErr:  []string{`setting up secret volume "creds" of pod ns/pod: secret "s" not found`},
		kubelet:  `secret "s" not found`,
		notFound: true,
	}, {
		name:    "a missing key: the kubelet's error, naming the object",
		secret:  objtest.Secret("s", map[string]string{"a": "A"}),
		src:     v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "a", Path: "a"}, {Key: "gone", Path: "g"}}},
		wantErr: []string{`secret volume "creds" of pod ns/pod: secret ns/s: references non-existent secret key: gone`},
		kubelet: `references non-existent secret key: gone`,
	}, {
		name:    "a key of ..",
		secret:  objtest.Secret("s", map[string]string{"ok": "A", "..": "B"}),
		src:     v1.SecretVolumeSource{SecretName: "s"},
		wantErr: []string{`secret volume "creds" of pod ns/pod`, `secret ns/s`, `key ".."`, "must not contain '..'"},
	}, {
		name:    "a key with a /",
		secret:  objtest.Secret("s", map[string]string{"a/b": "B"}),
		src:     v1.SecretVolumeSource{SecretName: "s"},
		wantErr: []string{`secret volume "creds" of pod ns/pod`, `secret ns/s`, `key "a/b"`, "must not contain '/'"},
	}, {
		name:    "an absolute key",
		secret:  objtest.Secret("s", map[string]string{"/etc/passwd": "B"}),
		src:     v1.SecretVolumeSource{SecretName: "s"},
		wantErr: []string{`secret volume "creds" of pod ns/pod`, `secret ns/s`, `key "/etc/passwd"`},
	}, {
		name:    "a key starting with ..",
		secret:  objtest.Secret("s", map[string]string{"..data": "B"}),
		src:     v1.SecretVolumeSource{SecretName: "s"},
		wantErr: []string{`secret ns/s`, `key "..data"`, "must not start with '..'"},
	}} {
		t.Run(tc.name, func(t *testing.T) { checkSetUp(t, tc) })
	}
}

// checkSetUp sets up the volume of tc and checks the outcome.
func checkSetUp(t *testing.T, tc setUpCase) {
	fake := mount.NewFakeMounter(nil)
	e := newEnv(t, "", fake)
	if tc.secret != nil {
		e.Objs.Put(tc.secret)
	}
	spec := e.spec(t, "creds", tc.src)
	dir, err := e.SetUp(context.Background(), objtest.Request(spec, "creds", tc.fsGroup))
	if tc.wantErr != nil {
		if err == nil {
			t.Fatalf("SetUp succeeded, want an error with %q", tc.wantErr)
		}
		for _, w := range tc.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
		if _, cause := volume.EventCause(err); tc.kubelet != "" && cause != tc.kubelet {
			t.Errorf("the kubelet's words %q, want %q", cause, tc.kubelet)
		}
		if apierrors.IsNotFound(err) != tc.notFound || volume.IsUncertain(err) {
			t.Errorf("error %v: not found %v (want %v), uncertain %v (want false)", err, apierrors.IsNotFound(err), tc.notFound, volume.IsUncertain(err))
		}
		if s := e.Steps.Taken(); len(s) != 0 || objtest.Exists(t, filepath.Join(e.Root, "pods")) {
			t.Errorf("the failed SetUp changed the node: %v", s)
		}
		return
	}
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	if dir != e.Dir("creds") {
		t.Errorf("SetUp returned %s, want %s", dir, e.Dir("creds"))
	}
	got := objtest.ReadVolume(t, dir, tc.fsGroup != nil)
	if !maps.Equal(got, tc.want) {
		t.Errorf("files %v, want %v", got, tc.want)
	}
	mps, _ := fake.List()
	if len(mps) != 1 || mps[0].Path != dir || mps[0].Type != "tmpfs" || !slices.Contains(mps[0].Opts, "size=67108864") {
		t.Errorf("mounts %+v, want a tmpfs of the pod's 64Mi at %s", mps, dir)
	}
}

// TestUpdate: a changed secret switches the files at once through ..data;
// SetUp with nothing changed changes nothing; a failed update keeps the
// old files.
func TestUpdate(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "", mount.NewFakeMounter(nil))
	e.Objs.Put(objtest.Secret("s", map[string]string{"a": "1", "b": "1"}))
	spec := e.spec(t, "creds", v1.SecretVolumeSource{SecretName: "s"})
	req := objtest.Request(spec, "creds", nil)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	first := objtest.DataTarget(t, dir)
	e.Steps.Taken()
	if _, err := e.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	if s := e.Steps.Taken(); len(s) != 0 {
		t.Fatalf("SetUp of an unchanged secret took steps %v", s)
	}

	e.Objs.Put(objtest.Secret("s", map[string]string{"a": "2", "c": "2"}))
	if _, err := e.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := objtest.ReadVolume(t, dir, false), map[string]string{"a": "0644:-1:-1:2", "c": "0644:-1:-1:2"}; !maps.Equal(got, want) {
		t.Fatalf("after the update: %v, want %v", got, want)
	}
	second := objtest.DataTarget(t, dir)
	steps := e.Steps.Taken()
	if second == first || !switched(steps, dir) {
		t.Errorf("..data %s then %s; steps %v: want a new version switched to by renaming ..data_tmp over ..data", first, second, steps)
	}

	// A missing key and a deleted secret leave the files as they were.
	for _, change := range []func(){
		func() { e.Objs.Put(objtest.Secret("s", map[string]string{"..": "x"})) },
		func() { e.Objs.Err = apierrors.NewNotFound(v1.Resource("secrets"), "s") },
		func() { e.Objs.Err = errors.New("connection refused") },
	} {
		change()
		if _, err := e.SetUp(ctx, req); err == nil || volume.IsUncertain(err) {
			t.Fatalf("SetUp of a broken secret: %v, want a plain error", err)
		}
		if got := objtest.ReadVolume(t, dir, false); got["a"] != "0644:-1:-1:2" || objtest.DataTarget(t, dir) != second || len(e.Steps.Taken()) != 0 {
			t.Fatalf("a failed update changed the volume: %v", got)
		}
	}
}

// switched reports whether steps made ..data_tmp and renamed it in dir.
func switched(steps []step.Step, dir string) bool {
	var link, rename bool
	for _, s := range steps {
		link = link || s.Op == step.Symlink && s.Path == filepath.Join(dir, "..data_tmp")
		rename = rename || s.Op == step.Rename && strings.HasPrefix(s.Path, dir)
	}
	return link && rename
}

// TestResolveSpec: what the pod spec gives is checked, the tmpfs is sized
// by the pod, and an error names the pod and the volume.
func TestResolveSpec(t *testing.T) {
	e := newEnv(t, "", mount.NewFakeMounter(nil))
	tests := []struct {
		name    string
		pod     *v1.Pod
		src     v1.SecretVolumeSource
		size    string
		wantErr string
	}{
		{name: "the pod's memory limit", pod: objtest.Pod("64Mi"), src: v1.SecretVolumeSource{SecretName: "s"}, size: "67108864"},
		{name: "the node's allocatable", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s"}, size: "8589934592"},
		{name: "no name", pod: objtest.Pod(""), src: v1.SecretVolumeSource{}, wantErr: "the source names no secret"},
		{name: "an item leaving the volume", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "k", Path: "../x"}}},
			wantErr: `items[0] (key "k"): invalid path: must not contain '..'`},
		{name: "an absolute item path", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "k", Path: "/x"}}},
			wantErr: "must be relative path"},
		{name: "two items at one path", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "k", Path: "x"}, {Key: "l", Path: "x/"}}},
			wantErr: "two items have the path x"},
		{name: "an item below another", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "k", Path: "x"}, {Key: "l", Path: "x/y"}}},
			wantErr: "item path x is a file and a directory of item path x/y"},
		{name: "a mode too large", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o1777)},
			wantErr: "defaultMode 01777: must be between 0 and 0777"},
		{name: "an item mode negative", pod: objtest.Pod(""), src: v1.SecretVolumeSource{SecretName: "s", Items: []v1.KeyToPath{{Key: "k", Path: "k", Mode: ptr[int32](-1)}}},
			wantErr: `items[0] (key "k") mode -01: must be between 0 and 0777`},
	}
	for _, tc := range tests {
		spec := &podvol.VolumeSpec{Name: PluginName + "/" + podvol.UniqueVolumeName(objtest.UID) + "-creds", Source: &v1.VolumeSource{Secret: &tc.src}}
		err := e.Plugin.(volume.SpecResolver).ResolveSpec(tc.pod, spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "of pod ns/pod") || !strings.Contains(err.Error(), "-creds") {
				t.Errorf("%s: error %v, want one naming the pod, the volume and %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || spec.Attributes["sizeBytes"] != tc.size {
			t.Errorf("%s: %v, attributes %v, want size %s", tc.name, err, spec.Attributes, tc.size)
		}
	}
	// An unresolved spec is refused by SetUp, before anything is made.
	spec := &podvol.VolumeSpec{Source: &v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}}
	if _, err := e.SetUp(context.Background(), objtest.Request(spec, "creds", nil)); err == nil || !strings.Contains(err.Error(), "not resolved") || objtest.Exists(t, e.Dir("creds")) {
		t.Errorf("SetUp of an unresolved spec: %v", err)
	}
}

// TestRestart: a volume's tmpfs found mounted with its ready file is
// Uncertain (its files may be half-written), SetUp again changes nothing, TearDown from the path alone
// leaves nothing; and TearDown again is a no-op.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	fake := mount.NewFakeMounter(nil)
	e := newEnv(t, "", fake)
	e.Objs.Put(objtest.Secret("s", map[string]string{"a": "A"}))
	spec := e.spec(t, "creds", v1.SecretVolumeSource{SecretName: "s"})
	dir, err := e.SetUp(ctx, objtest.Request(spec, "creds", nil))
	if err != nil {
		t.Fatal(err)
	}

	after := newEnv(t, e.Root, fake)
	after.Objs.Put(objtest.Secret("s", map[string]string{"a": "A"}))
	found := after.Plugin.(volume.Reconstructor).Reconstruct(ctx, volume.Recovery{MountPoints: map[string]bool{dir: true}})
	if len(found.Mounts) != 1 {
		t.Fatalf("Reconstruct = %+v", found)
	}
	m := found.Mounts[0]
	if m.Spec.Name != spec.Name || m.Spec.Plugin != PluginName || !m.Spec.Ephemeral || m.Volume.Pod.UID != objtest.UID || m.Volume.SpecName != "creds" || m.Path != dir || m.State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v, want %s Uncertain at %s", m, spec.Name, dir)
	}
	if _, err := after.SetUp(ctx, objtest.Request(spec, "creds", nil)); err != nil || len(after.Steps.Taken()) != 0 {
		t.Fatalf("SetUp after the restart: %v, or it changed something", err)
	}
	for range 2 {
		if err := after.TearDown(ctx, volume.MountRequest{Spec: &podvol.VolumeSpec{Name: spec.Name, Plugin: PluginName}, Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: objtest.UID}, SpecName: "creds"}}); err != nil {
			t.Fatal(err)
		}
		if mps, _ := fake.List(); len(mps) != 0 || objtest.Exists(t, dir) || objtest.Exists(t, filepath.Join(e.Root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_creds")) {
			t.Fatalf("after TearDown: mounts %v, directory there %v", mps, objtest.Exists(t, dir))
		}
	}
}

// TestPlugin: the plugin's name, the sources it claims, its capabilities,
// its Refs and its Config.
func TestPlugin(t *testing.T) {
	e := newEnv(t, "", mount.NewFakeMounter(nil))
	caps, err := e.Capabilities(nil)
	if e.Name() != PluginName || err != nil || !reflect.DeepEqual(caps, volume.Capabilities{Republish: true, ReadOnly: true}) {
		t.Errorf("Name %s, Capabilities %+v, %v", e.Name(), caps, err)
	}
	if !e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{}}}) ||
		e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}}) || e.CanSupport(nil) {
		t.Error("CanSupport claims the wrong sources")
	}
	want := []objectcache.Ref{{Kind: objectcache.Secret, Namespace: "ns", Name: "s"}}
	if got := refs("ns", &v1.SecretVolumeSource{SecretName: "s", Optional: ptr(true)}); !slices.Equal(got, want) {
		t.Errorf("Refs = %v, want %v", got, want)
	}
	if got := refs("ns", nil); got != nil {
		t.Errorf("Refs(nil) = %v", got)
	}
	// The volume manager asks the plugin (volume.ObjectReader).
	r := e.Plugin.(volume.ObjectReader)
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}}); !slices.Equal(got, want) {
		t.Errorf("Objects = %v, want %v", got, want)
	}
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "s"}}}}); got != nil {
		t.Errorf("Objects of a configMap volume = %v, want none", got)
	}
	for _, cfg := range []Config{{Mounter: mount.NewFakeMounter(nil), Objects: e.Objs}, {RootDir: t.TempDir(), Objects: e.Objs}, {RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}
