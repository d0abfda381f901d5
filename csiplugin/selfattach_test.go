package csiplugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// selfAttachPlugin is a plugin with a fake clientset holding objs; its
// listers hold the same CSIDrivers and VolumeAttachments (and do not see
// later changes).
func selfAttachPlugin(t *testing.T, objs ...runtime.Object) (*plugin, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	var drivers []any
	for _, o := range objs {
		switch o := o.(type) {
		case *storagev1.CSIDriver, *storagev1.VolumeAttachment:
			drivers = append(drivers, o)
		}
	}
	dl, vl := listers(t, drivers...)
	p, err := newPlugin(Config{RootDir: t.TempDir(), NodeName: testNode, CSIDriverLister: dl, VolumeAttachmentLister: vl,
		KubeClient: client, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	return p, client
}

// writes lists the VolumeAttachment writes the client saw, as "verb name".
func writes(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "volumeattachments" || a.GetVerb() == "get" {
			continue
		}
		name := ""
		switch a := a.(type) {
		case clienttesting.CreateAction: // an UpdateAction too: same method set
			name = a.GetObject().(*storagev1.VolumeAttachment).Name
		case clienttesting.DeleteAction:
			name = a.GetName()
		}
		out = append(out, a.GetVerb()+" "+name)
	}
	return out
}

func TestSelfAttachCreatesVolumeAttachment(t *testing.T) {
	const drv = "csi.example.com"
	ctx := context.Background()
	spec := testSpec(drv)
	p, client := selfAttachPlugin(t)
	name := AttachmentName(spec.VolumeHandle, drv, testNode)

	pc, err := p.Attach(ctx, spec)
	if !errors.Is(err, volume.ErrNotReady) || pc != nil {
		t.Fatalf("Attach before the attacher answered = %v, %v; want ErrNotReady", pc, err)
	}
	va, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := "pv-1"
	want := storagev1.VolumeAttachmentSpec{Attacher: drv, NodeName: testNode, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}}
	if diff := cmp.Diff(want, va.Spec); diff != "" {
		t.Errorf("VolumeAttachment spec (-want +got):\n%s", diff)
	}
	if va.Name != "csi-b74c7fc125891ffa0d0f2e0d645733e3fae7fba3066e76500a771ea08be9da28" {
		t.Errorf("VolumeAttachment name %s", va.Name)
	}

	// The external-attacher attaches it; Attach again creates nothing.
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"dev": "/dev/xvdb"}}
	if _, err := client.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pc, err = p.Attach(ctx, spec)
	if err != nil || pc["dev"] != "/dev/xvdb" {
		t.Fatalf("Attach once attached = %v, %v", pc, err)
	}
	if diff := cmp.Diff([]string{"create " + name, "update " + name, "create " + name}, writes(client)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}

	// Detach deletes it; without a finalizer it is gone at once.
	if err := p.Detach(ctx, spec); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("VolumeAttachment after Detach: %v", err)
	}
	if err := p.Detach(ctx, spec); err != nil {
		t.Errorf("Detach of a detached volume: %v", err)
	}
}

func TestSelfAttachInlineVolumeSpec(t *testing.T) {
	const drv = "csi.example.com"
	ctx := context.Background()
	spec := testSpec(drv)
	spec.PVName = ""
	spec.Attributes = map[string]string{"k": "v"}
	spec.NodeStageSecret = &podvol.SecretRef{Namespace: "ns", Name: "s"}
	spec.MountOptions = []string{"noatime"}
	p, client := selfAttachPlugin(t)
	if _, err := p.Attach(ctx, spec); !errors.Is(err, volume.ErrNotReady) {
		t.Fatalf("Attach: %v", err)
	}
	va, err := client.StorageV1().VolumeAttachments().Get(ctx, AttachmentName(spec.VolumeHandle, drv, testNode), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs := v1.PersistentVolumeFilesystem
	want := &v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
			Driver: drv, VolumeHandle: "vol-1", FSType: "ext4", VolumeAttributes: map[string]string{"k": "v"},
			NodeStageSecretRef: &v1.SecretReference{Namespace: "ns", Name: "s"},
		}},
		AccessModes:  []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		MountOptions: []string{"noatime"},
		VolumeMode:   &fs,
	}
	if va.Spec.Source.PersistentVolumeName != nil {
		t.Errorf("persistentVolumeName %q set for a volume without a PV", *va.Spec.Source.PersistentVolumeName)
	}
	if diff := cmp.Diff(want, va.Spec.Source.InlineVolumeSpec); diff != "" {
		t.Errorf("inlineVolumeSpec (-want +got):\n%s", diff)
	}
}

func TestSelfAttachNotNeeded(t *testing.T) {
	const drv = "csi.example.com"
	no := false
	tests := []struct {
		name string
		spec func(*podvol.VolumeSpec)
		objs []runtime.Object
	}{
		{name: "attachRequired false", objs: []runtime.Object{csiDriverObj(drv, func(d *storagev1.CSIDriver) { d.Spec.AttachRequired = &no })}},
		{name: "inline ephemeral", spec: func(s *podvol.VolumeSpec) { s.Ephemeral = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := testSpec(drv)
			if tt.spec != nil {
				tt.spec(spec)
			}
			p, client := selfAttachPlugin(t, tt.objs...)
			pc, err := p.Attach(context.Background(), spec)
			if err != nil || pc != nil {
				t.Errorf("Attach = %v, %v; want nil, nil", pc, err)
			}
			if w := writes(client); len(w) != 0 {
				t.Errorf("writes: %v", w)
			}
		})
	}
}

// TestSelfAttachOtherNodeConflict: a VolumeAttachment of the volume's name
// that belongs to another node (or attacher) is an error and is neither
// adopted nor deleted.
func TestSelfAttachOtherNodeConflict(t *testing.T) {
	const drv = "csi.example.com"
	ctx := context.Background()
	spec := testSpec(drv)
	for _, tt := range []struct {
		name   string
		mutate func(*storagev1.VolumeAttachment)
		want   string
	}{
		{"other node", func(va *storagev1.VolumeAttachment) { va.Spec.NodeName = "node-2"; va.Status.Attached = true }, `exists for node "node-2" and attacher "csi.example.com"`},
		{"other attacher", func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.example.com" }, `exists for node "node-1" and attacher "other.example.com"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			other := vaObj(spec, tt.mutate)
			p, client := selfAttachPlugin(t, other)
			_, err := p.Attach(ctx, spec)
			if !errors.Is(err, errAttachmentConflict) || errors.Is(err, volume.ErrNotReady) {
				t.Fatalf("Attach = %v; want errAttachmentConflict", err)
			}
			for _, s := range []string{`"kubernetes.io/csi/csi.example.com^vol-1" (PV pv-1, driver csi.example.com)`, "to node node-1", other.Name, tt.want} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
			if err := p.Detach(ctx, spec); err != nil {
				t.Errorf("Detach: %v", err)
			}
			got, err := client.StorageV1().VolumeAttachments().Get(ctx, other.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the other VolumeAttachment: %v", err)
			}
			if diff := cmp.Diff(other.Spec, got.Spec); diff != "" {
				t.Errorf("the other VolumeAttachment changed (-want +got):\n%s", diff)
			}
			if w := writes(client); len(w) != 0 {
				t.Errorf("writes: %v; want none", w)
			}
		})
	}
}

// TestSelfDetachWaits: with a finalizer (the external-attacher's) the
// VolumeAttachment stays after the delete: Detach waits (ErrNotReady) and
// reports a detach error.
func TestSelfDetachWaits(t *testing.T) {
	const drv = "csi.example.com"
	ctx := context.Background()
	spec := testSpec(drv)
	va := vaObj(spec, func(va *storagev1.VolumeAttachment) {
		va.Finalizers = []string{"external-attacher/csi-example-com"}
		va.Status.Attached = true
	})
	p, client := selfAttachPlugin(t, va)
	// The fake clientset deletes at once; a finalizer makes the API
	// server set deletionTimestamp instead.
	client.PrependReactor("delete", "volumeattachments", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := client.Tracker().Get(a.GetResource(), "", a.(clienttesting.DeleteAction).GetName())
		if err != nil {
			return true, nil, err
		}
		va := obj.(*storagev1.VolumeAttachment).DeepCopy()
		now := metav1.Now()
		va.DeletionTimestamp = &now
		return true, nil, client.Tracker().Update(a.GetResource(), va, "")
	})
	err := p.Detach(ctx, spec)
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "to be detached and deleted") {
		t.Fatalf("Detach with a finalizer = %v; want ErrNotReady", err)
	}
	got, _ := client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
	got.Status.DetachError = &storagev1.VolumeError{Message: "rpc error: code = Internal desc = disk busy"}
	if _, err := client.StorageV1().VolumeAttachments().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = p.Detach(ctx, spec)
	if err == nil || errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "disk busy") || !strings.Contains(err.Error(), va.Name) {
		t.Fatalf("Detach with a detach error = %v", err)
	}
	if _, cause := volume.EventCause(err); cause != "rpc error: code = Internal desc = disk busy" {
		t.Errorf("the kubelet's words %q, want the attacher's message alone", cause)
	}
	if diff := cmp.Diff([]string{"delete " + va.Name, "update " + va.Name}, writes(client)); diff != "" {
		t.Errorf("writes (-want +got):\n%s (one delete only)", diff)
	}
}

func TestSelfAttachWithoutClient(t *testing.T) {
	p := attachPlugin(t)
	if _, err := p.Attach(context.Background(), testSpec("csi.example.com")); err == nil || !strings.Contains(err.Error(), "KubeClient") {
		t.Errorf("Attach without a client = %v", err)
	}
	if err := p.Detach(context.Background(), testSpec("csi.example.com")); err == nil || !strings.Contains(err.Error(), "KubeClient") {
		t.Errorf("Detach without a client = %v", err)
	}
}

// TestSelfAttachConflictNotInLister: the lister has not seen the other
// node's VolumeAttachment yet: the create fails with AlreadyExists and
// the one read back is refused.
func TestSelfAttachConflictNotInLister(t *testing.T) {
	const drv = "csi.example.com"
	spec := testSpec(drv)
	other := vaObj(spec, func(va *storagev1.VolumeAttachment) { va.Spec.NodeName = "node-2" })
	p, client := selfAttachPlugin(t)
	if err := client.Tracker().Add(other); err != nil {
		t.Fatal(err)
	}
	_, err := p.Attach(context.Background(), spec)
	if !errors.Is(err, errAttachmentConflict) || !strings.Contains(err.Error(), `exists for node "node-2"`) {
		t.Fatalf("Attach = %v; want errAttachmentConflict", err)
	}
	got, _ := client.StorageV1().VolumeAttachments().Get(context.Background(), other.Name, metav1.GetOptions{})
	if diff := cmp.Diff(other.Spec, got.Spec); diff != "" {
		t.Errorf("the other VolumeAttachment changed (-want +got):\n%s", diff)
	}
}

// TestSelfAttachCreateFails: a VolumeAttachment the API server does not
// create is an error naming it, in the kubelet's words
// ("kubernetes.io/csi: attacher.Attach failed: " and the API's error).
func TestSelfAttachCreateFails(t *testing.T) {
	spec := testSpec("csi.example.com")
	p, client := selfAttachPlugin(t)
	client.PrependReactor("create", "volumeattachments", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("volumeattachments is forbidden")
	})
	_, err := p.Attach(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "creating VolumeAttachment "+AttachmentName("vol-1", "csi.example.com", testNode)) {
		t.Fatalf("Attach = %v, want the create's error", err)
	}
	if _, cause := volume.EventCause(err); cause != "kubernetes.io/csi: attacher.Attach failed: volumeattachments is forbidden" {
		t.Errorf("the kubelet's words %q", cause)
	}
}
