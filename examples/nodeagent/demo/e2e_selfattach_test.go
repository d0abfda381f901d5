package main

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestEndToEndSelfAttach runs self-attach mode against the loop driver
// (attachRequired: true): nodevol creates each volume's VolumeAttachment,
// the test kit's fake attacher attaches it with a publish context, the
// volumes mount on real loop devices; when the pods go, each volume is
// unstaged, its VolumeAttachment deleted, and nothing is left.
func TestEndToEndSelfAttach(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, drv := startE2E(t, ctx, "nv-sa-", "node-1")
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{AttachRequired: true}))
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{Driver: drv.name})
	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: "node-1", KubeClient: client, RootDir: root, Mounter: drv.mounter, SelfAttach: true}, drv.name, drv.endpoint)
	pods, err := provision(ctx, client, drv, 2, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		path, err := mountAndUse(ctx, vm, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := source(drv.mounter, path); !strings.HasPrefix(got, "ext4 on /dev/loop") {
			t.Fatalf("pod %s: %s is %q, want ext4 on a loop device", p.Name, path, got)
		}
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vas.Items) != len(pods) {
		t.Fatalf("%d VolumeAttachments, want %d", len(vas.Items), len(pods))
	}
	var names []string
	for _, va := range vas.Items {
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, *va.Spec.Source.PersistentVolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := csiplugin.AttachmentName(pv.Spec.CSI.VolumeHandle, drv.name, "node-1"); va.Name != want {
			t.Errorf("VolumeAttachment %s, want %s", va.Name, want)
		}
		if va.Spec.Attacher != drv.name || va.Spec.NodeName != "node-1" || va.Spec.Source.InlineVolumeSpec != nil || !va.Status.Attached {
			t.Errorf("VolumeAttachment %s: spec %+v status %+v", va.Name, va.Spec, va.Status)
		}
		names = append(names, va.Name)
	}

	deletePods(t, ctx, vm, pods)
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	// The volumes are forgotten only after their VolumeAttachments went.
	for _, name := range names {
		if _, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("VolumeAttachment %s after the volumes were forgotten: %v", name, err)
		}
	}
	assertClean(t, drv, root)
}
