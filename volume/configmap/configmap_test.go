package configmap

import (
	"context"
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
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// setUpCase is a SetUp of TestSetUp and what it should do.
type setUpCase struct {
	name     string
	cm       *v1.ConfigMap // nil: missing
	src      v1.ConfigMapVolumeSource
	fsGroup  *int64
	want     map[string]string // path: "mode:gid:content" (gid -1: unchecked)
	wantErr  []string
	kubelet  string // the kubelet's words for the error (volume.EventCause)
	notFound bool
}

// TestSetUp: the files of a configMap volume, as the kubelet writes them,
// in a directory on disk; and the errors that leave nothing behind.
func TestSetUp(t *testing.T) {
	gid := int64(os.Getgid())
	for _, tc := range []setUpCase{{
		name: "data and binaryData, the default mode when the spec has none",
		cm:   objtest.ConfigMap("c", map[string]string{"a.conf": "A"}, map[string][]byte{"b.bin": {0, 1, 2}}),
		src:  v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}},
		want: map[string]string{"a.conf": "0644:-1:-1:A", "b.bin": "0644:-1:-1:\x00\x01\x02"},
	}, {
		name: "items from data and binaryData, with their modes",
		cm:   objtest.ConfigMap("c", map[string]string{"a": "A", "x": "X"}, map[string][]byte{"b": []byte("B")}),
		src: v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}, DefaultMode: ptr[int32](0o444),
			Items: []v1.KeyToPath{{Key: "a", Path: "etc/a"}, {Key: "b", Path: "bin/b", Mode: ptr[int32](0o555)}}},
		want: map[string]string{"etc/a": "0444:-1:-1:A", "bin/b": "0555:-1:-1:B"},
	}, {
		name:    "fsGroup",
		cm:      objtest.ConfigMap("c", map[string]string{"a": "A"}, nil),
		src:     v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}, DefaultMode: ptr[int32](0o600)},
		fsGroup: &gid,
		want:    map[string]string{"a": fmt.Sprintf("0640:%d:%d:A", os.Getuid(), gid)},
	}, {
		name: "optional and missing: an empty volume",
		src:  v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}, Optional: ptr(true)},
		want: map[string]string{},
	}, {
		name: "optional: an item whose key is missing is skipped",
		cm:   objtest.ConfigMap("c", nil, map[string][]byte{"b": []byte("B")}),
		src: v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}, Optional: ptr(true),
			Items: []v1.KeyToPath{{Key: "gone", Path: "g"}, {Key: "b", Path: "b"}}},
		want: map[string]string{"b": "0644:-1:-1:B"},
	}, {
		name:     "missing: the kubelet's error",
		src:      v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}},
		wantErr:  []string{`setting up configMap volume "cfg" of pod ns/pod: configmap "c" not found`},
		kubelet:  `configmap "c" not found`,
		notFound: true,
	}, {
		name:    "a missing key: the kubelet's error, naming the object",
		cm:      objtest.ConfigMap("c", map[string]string{"a": "A"}, nil),
		src:     v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}, Items: []v1.KeyToPath{{Key: "gone", Path: "g"}}},
		wantErr: []string{`configMap volume "cfg" of pod ns/pod: configmap ns/c: configmap references non-existent config key: gone`},
		kubelet: `configmap references non-existent config key: gone`,
	}, {
		name:    "a binary key of ..",
		cm:      objtest.ConfigMap("c", map[string]string{"a": "A"}, map[string][]byte{"..": []byte("B")}),
		src:     v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}},
		wantErr: []string{`configMap volume "cfg" of pod ns/pod`, `configmap ns/c`, `key ".."`, "must not contain '..'"},
	}, {
		name:    "a key with a /",
		cm:      objtest.ConfigMap("c", map[string]string{"../../etc/x": "A"}, nil),
		src:     v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}},
		wantErr: []string{`configmap ns/c`, `key "../../etc/x"`, "must not contain '/'"},
	}} {
		t.Run(tc.name, func(t *testing.T) { checkSetUp(t, tc) })
	}
}

// checkSetUp sets up the volume of tc and checks the outcome.
func checkSetUp(t *testing.T, tc setUpCase) {
	fake := mount.NewFakeMounter(nil)
	e := newEnv(t, "", fake)
	if tc.cm != nil {
		e.Objs.Put(tc.cm)
	}
	dir, err := e.SetUp(context.Background(), objtest.Request(e.spec(t, "cfg", tc.src), "cfg", tc.fsGroup))
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
	if got := objtest.ReadVolume(t, dir, tc.fsGroup != nil); dir != e.Dir("cfg") || !maps.Equal(got, tc.want) {
		t.Errorf("SetUp at %s: files %v, want %v at %s", dir, got, tc.want, e.Dir("cfg"))
	}
	if mps, _ := fake.List(); len(mps) != 0 {
		t.Errorf("mounts %+v: a configMap volume is on disk", mps)
	}
}

// TestUpdateAndRestart: a changed configMap switches the files at once,
// SetUp with nothing changed changes nothing, a directory found at start
// is Uncertain and written again by SetUp, and TearDown from the path
// alone leaves nothing.
func TestUpdateAndRestart(t *testing.T) {
	ctx := context.Background()
	fake := mount.NewFakeMounter(nil)
	e := newEnv(t, "", fake)
	e.Objs.Put(objtest.ConfigMap("c", map[string]string{"a": "1"}, nil))
	spec := e.spec(t, "cfg", v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}})
	req := objtest.Request(spec, "cfg", nil)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	first := objtest.DataTarget(t, dir)
	e.Steps.Taken()
	if _, err := e.SetUp(ctx, req); err != nil || len(e.Steps.Taken()) != 0 {
		t.Fatalf("SetUp of an unchanged configMap: %v, or it changed something", err)
	}
	e.Objs.Put(objtest.ConfigMap("c", map[string]string{"b": "2"}, map[string][]byte{"a": []byte("2")}))
	if _, err := e.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := objtest.ReadVolume(t, dir, false), map[string]string{"a": "0644:-1:-1:2", "b": "0644:-1:-1:2"}; !maps.Equal(got, want) || objtest.DataTarget(t, dir) == first {
		t.Fatalf("after the update: %v (..data %s, was %s), want %v in a new version", got, objtest.DataTarget(t, dir), first, want)
	}

	after := newEnv(t, e.Root, fake)
	after.Objs.Put(objtest.ConfigMap("c", map[string]string{"b": "3"}, nil))
	found := after.Plugin.(volume.Reconstructor).Reconstruct(ctx, volume.Recovery{MountPoints: map[string]bool{}})
	if len(found.Mounts) != 1 || found.Mounts[0].Spec.Name != spec.Name || found.Mounts[0].Spec.Plugin != PluginName || found.Mounts[0].Path != dir || found.Mounts[0].State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v, want %s Uncertain at %s", found, spec.Name, dir)
	}
	if _, err := after.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := objtest.ReadVolume(t, dir, false), map[string]string{"b": "0644:-1:-1:3"}; !maps.Equal(got, want) {
		t.Fatalf("SetUp after the restart: %v, want %v", got, want)
	}
	for range 2 {
		if err := after.TearDown(ctx, volume.MountRequest{Spec: &podvol.VolumeSpec{Name: spec.Name, Plugin: PluginName}, Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: objtest.UID}, SpecName: "cfg"}}); err != nil {
			t.Fatal(err)
		}
		if objtest.Exists(t, dir) || objtest.Exists(t, filepath.Join(e.Root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_cfg")) {
			t.Fatal("TearDown left the volume")
		}
	}
}

// TestPlugin: the plugin's name, the sources it claims, its capabilities,
// its Refs, what ResolveSpec refuses and its Config.
func TestPlugin(t *testing.T) {
	e := newEnv(t, "", mount.NewFakeMounter(nil))
	caps, err := e.Capabilities(nil)
	if e.Name() != PluginName || err != nil || !reflect.DeepEqual(caps, volume.Capabilities{Republish: true, ReadOnly: true}) {
		t.Errorf("Name %s, Capabilities %+v, %v", e.Name(), caps, err)
	}
	if !e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}}) ||
		e.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{}}}) || e.CanSupport(nil) {
		t.Error("CanSupport claims the wrong sources")
	}
	src := &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}}
	want := []objectcache.Ref{{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "c"}}
	if got := refs("ns", src); !slices.Equal(got, want) || refs("ns", nil) != nil {
		t.Errorf("Refs = %v, want %v", got, want)
	}
	// The volume manager asks the plugin (volume.ObjectReader).
	r := e.Plugin.(volume.ObjectReader)
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{ConfigMap: src}}); !slices.Equal(got, want) {
		t.Errorf("Objects = %v, want %v", got, want)
	}
	if got := r.Objects("ns", &v1.Volume{VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "c"}}}); got != nil {
		t.Errorf("Objects of a secret volume = %v, want none", got)
	}
	spec := &podvol.VolumeSpec{Name: "kubernetes.io/configmap/uid-cfg", Source: &v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: src.LocalObjectReference, Items: []v1.KeyToPath{{Key: "k", Path: "a/../../x"}}}}}
	if err := e.Plugin.(volume.SpecResolver).ResolveSpec(objtest.Pod(""), spec); err == nil || !strings.Contains(err.Error(), "configMap volume kubernetes.io/configmap/uid-cfg of pod ns/pod") || spec.Attributes != nil {
		t.Errorf("ResolveSpec of an item leaving the volume: %v", err)
	}
	if _, err := New(Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)}); err == nil {
		t.Error("New without Objects succeeded")
	}
}
