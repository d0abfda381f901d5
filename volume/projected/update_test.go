package projected

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// TestTokenRefresh: at each resync SetUp asks the token cache and writes
// nothing while the token is the same; a refreshed token switches the
// files at once with only the token changed; a refused refresh keeps the
// old files.
func TestTokenRefresh(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "", nil)
	e.objs.Put(kubeRootCA())
	pod, name := testPod(), "kube-api-access-x7k2q"
	spec := e.spec(t, pod, name, kubeAPIAccess())
	req := request(pod, spec, name, nil)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	before := objtest.ReadVolume(t, dir, true)
	e.steps.Taken()

	for range 3 { // resyncs
		if _, err := e.SetUp(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.steps.Taken(); len(s) != 0 || len(e.tokens.requests) != 4 {
		t.Errorf("resyncs took steps %v; %d token requests, want 4 (one per SetUp, from the cache)", s, len(e.tokens.requests))
	}

	e.tokens.rotate()
	data, _ := os.Readlink(filepath.Join(dir, "..data"))
	if _, err := e.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	after := objtest.ReadVolume(t, dir, true)
	want := map[string]string{"token": own(0o644, "app-1"), "ca.crt": before["ca.crt"], "namespace": before["namespace"]}
	if len(after) != len(want) || after["token"] != want["token"] || after["ca.crt"] != want["ca.crt"] || after["namespace"] != want["namespace"] {
		t.Errorf("after the refresh: %v, want %v", after, want)
	}
	if now, _ := os.Readlink(filepath.Join(dir, "..data")); now == data {
		t.Error("..data did not switch to a new version")
	}

	e.tokens.err = errors.New("the API server is away")
	if _, err := e.SetUp(ctx, req); err == nil || volume.IsUncertain(err) {
		t.Errorf("SetUp with the token refused: %v, want a plain error", err)
	}
	if got := objtest.ReadVolume(t, dir, true); got["token"] != want["token"] {
		t.Errorf("the failed refresh changed the token: %v", got)
	}
}

// TestObjectUpdate: a changed configMap is written at the next SetUp
// (the volume manager calls it when the object changes).
func TestObjectUpdate(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "", nil)
	e.objs.Put(objtest.ConfigMap("c", map[string]string{"a": "1"}, nil))
	pod := testPod()
	spec := e.spec(t, pod, "vol", v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{cmSource("c", false), tokenSource("token")}})
	dir, err := e.SetUp(ctx, request(pod, spec, "vol", nil))
	if err != nil {
		t.Fatal(err)
	}
	e.objs.Put(objtest.ConfigMap("c", map[string]string{"a": "2", "b": "3"}, nil))
	if _, err := e.SetUp(ctx, request(pod, spec, "vol", nil)); err != nil {
		t.Fatal(err)
	}
	got := objtest.ReadVolume(t, dir, true)
	if got["a"] != own(0o644, "2") || got["b"] != own(0o644, "3") || got["token"] != own(0o644, "app-0") {
		t.Errorf("after the update: %v", got)
	}
}

// TestRestart: a volume's tmpfs found mounted with its ready file is
// Uncertain (its files may be half written); SetUp again changes nothing; TearDown from the path alone
// leaves nothing, and again is a no-op.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "", nil)
	e.objs.Put(kubeRootCA())
	pod, name := testPod(), "kube-api-access-x7k2q"
	spec := e.spec(t, pod, name, kubeAPIAccess())
	dir, err := e.SetUp(ctx, request(pod, spec, name, nil))
	if err != nil {
		t.Fatal(err)
	}

	after := newEnv(t, e.root, e.fake)
	after.objs.Put(kubeRootCA())
	found := after.Reconstruct(ctx, volume.Recovery{MountPoints: map[string]bool{dir: true}})
	if len(found.Mounts) != 1 {
		t.Fatalf("Reconstruct = %+v", found)
	}
	m := found.Mounts[0]
	if m.Spec.Name != spec.Name || m.Spec.Plugin != PluginName || !m.Spec.Ephemeral || m.Volume.Pod.UID != objtest.UID || m.Volume.SpecName != name || m.Path != dir || m.State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v, want %s Uncertain (SetUp confirms its files) at %s", m, spec.Name, dir)
	}
	spec = after.spec(t, pod, name, kubeAPIAccess())
	if _, err := after.SetUp(ctx, request(pod, spec, name, nil)); err != nil || len(after.steps.Taken()) != 0 {
		t.Fatalf("SetUp after the restart: %v, or it changed something", err)
	}
	for range 2 {
		if err := after.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
			t.Fatal(err)
		}
		if mps, _ := e.fake.List(); len(mps) != 0 || objtest.Exists(t, dir) || objtest.Exists(t, filepath.Join(e.root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_"+name)) {
			t.Fatalf("after TearDown: mounts %v, directory there %v", mps, objtest.Exists(t, dir))
		}
	}
}
