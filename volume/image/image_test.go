package image

import (
	"context"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func TestCanSupport(t *testing.T) {
	p := New()
	if p.Name() != "kubernetes.io/image" {
		t.Errorf("Name = %q", p.Name())
	}
	img := &v1.Volume{Name: "tools", VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "quay.io/x/tools:1"}}}
	if !p.CanSupport(img) {
		t.Error("CanSupport(image source) = false")
	}
	for _, v := range []*v1.Volume{
		nil,
		{Name: "none"},
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
	} {
		if p.CanSupport(v) {
			t.Errorf("CanSupport(%+v) = true", v)
		}
	}
}

// TestContract: what the planner reads and what the executor may call.
func TestContract(t *testing.T) {
	p := New()
	spec := &podvol.VolumeSpec{Name: "kubernetes.io/image/uid-1-tools"}
	caps, err := p.Capabilities(spec)
	if err != nil || !reflect.DeepEqual(caps, volume.Capabilities{ProvidedByRuntime: true}) {
		t.Errorf("Capabilities = %+v, %v; want only ProvidedByRuntime", caps, err)
	}
	if _, ok := p.(volume.Attacher); ok {
		t.Error("an image volume is attached")
	}
	if _, ok := p.(volume.DeviceMounter); ok {
		t.Error("an image volume is staged")
	}
	if _, ok := p.(volume.SelfAttacher); ok {
		t.Error("an image volume is attached by the node")
	}
	if _, ok := p.(volume.Expander); ok {
		t.Error("an image volume is expanded")
	}
	if _, ok := p.(volume.StatsProvider); ok {
		t.Error("an image volume has stats")
	}
	req := volume.MountRequest{Spec: spec, Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1"}, SpecName: "tools"}}
	if path, err := p.SetUp(context.Background(), req); path != "" || err != nil {
		t.Errorf("SetUp = %q, %v; want no path and no error", path, err)
	}
	if err := p.TearDown(context.Background(), req); err != nil {
		t.Errorf("TearDown = %v", err)
	}
}

// TestVolumeName: an image volume's unique name is the kubelet's for a
// volume neither attached nor staged, {plugin}/{podUID}-{specName}, and
// the registry finds the plugin from it.
func TestVolumeName(t *testing.T) {
	r, err := volume.NewRegistry(New())
	if err != nil {
		t.Fatal(err)
	}
	name := podvol.UniqueVolumeName("kubernetes.io/image/uid-1-tools")
	if p, err := r.ForVolume(name); err != nil || p.Name() != PluginName {
		t.Errorf("ForVolume(%s) = %v, %v", name, p, err)
	}
}
