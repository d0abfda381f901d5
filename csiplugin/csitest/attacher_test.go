package csitest

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
)

// waitForVA polls the API (the only way to see the attacher's async
// result) until done accepts the VolumeAttachment.
func waitForVA(t *testing.T, client kubernetes.Interface, name string, done func(*storagev1.VolumeAttachment) bool) *storagev1.VolumeAttachment {
	t.Helper()
	var va *storagev1.VolumeAttachment
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		va = got
		return done(got), nil
	})
	if err != nil {
		t.Fatalf("VolumeAttachment %s: %v (last seen %+v)", name, err, va)
	}
	return va
}

func TestFakeAttacherAttaches(t *testing.T) {
	ok := PV("pv-ok", PVSpec{Driver: "drv", Handle: "h-ok"})
	bad := PV("pv-bad", PVSpec{Driver: "drv", Handle: "h-bad"})
	other := PV("pv-other", PVSpec{Driver: "other-driver", Handle: "h-other"})
	// One VolumeAttachment exists before the attacher starts: the
	// informer's initial list must find it.
	early, err := volumeAttachmentFor(ok, "n1")
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(early)
	NewFakeAttacher(t, client, AttacherOptions{
		Driver:   "drv",
		Metadata: map[string]string{"devicePath": "/dev/x"},
		Fail:     map[string]string{"pv-bad": "no such disk"},
	})
	ctx := ctxFor(t)
	va := waitForVA(t, client, early.Name, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached })
	if va.Status.AttachmentMetadata["devicePath"] != "/dev/x" || va.Status.AttachError != nil {
		t.Errorf("status %+v", va.Status)
	}

	badVA, err := AttachVolume(ctx, client, bad, "n1")
	if err != nil {
		t.Fatal(err)
	}
	va = waitForVA(t, client, badVA.Name, func(va *storagev1.VolumeAttachment) bool { return va.Status.AttachError != nil })
	if va.Status.Attached || va.Status.AttachError.Message != "no such disk" {
		t.Errorf("status %+v", va.Status)
	}

	// Another driver's attachment is left alone; a marker attachment of
	// ours created after it proves the attacher has seen it.
	otherVA, err := AttachVolume(ctx, client, other, "n1")
	if err != nil {
		t.Fatal(err)
	}
	marker, err := AttachVolume(ctx, client, PV("pv-marker", PVSpec{Driver: "drv", Handle: "h-m"}), "n1")
	if err != nil {
		t.Fatal(err)
	}
	waitForVA(t, client, marker.Name, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached })
	if got, err := client.StorageV1().VolumeAttachments().Get(ctx, otherVA.Name, metav1.GetOptions{}); err != nil || got.Status.Attached || got.Status.AttachError != nil {
		t.Errorf("other driver's attachment touched: %+v, %v", got, err)
	}

	// AttachVolume is idempotent and DetachVolume deletes.
	again, err := AttachVolume(ctx, client, ok, "n1")
	if err != nil || again.Name != early.Name {
		t.Errorf("AttachVolume again = %v, %v", again, err)
	}
	if err := detachVolume(ctx, client, ok, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := detachVolume(ctx, client, ok, "n1"); err != nil {
		t.Errorf("second DetachVolume: %v", err)
	}
}

func TestFakeAttacherDelay(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	client := fake.NewClientset()
	NewFakeAttacher(t, client, AttacherOptions{Delay: time.Minute, Clock: clk})
	va, err := AttachVolume(ctxFor(t), client, PV("pv1", PVSpec{Driver: "drv", Handle: "h"}), "n1")
	if err != nil {
		t.Fatal(err)
	}
	// The worker is waiting on the fake clock once it has a waiter; until
	// the clock moves the attachment stays unattached.
	if err := wait.PollUntilContextTimeout(ctxFor(t), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return clk.HasWaiters(), nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := client.StorageV1().VolumeAttachments().Get(ctxFor(t), va.Name, metav1.GetOptions{}); got.Status.Attached {
		t.Fatal("attached before the delay")
	}
	clk.Step(time.Minute)
	waitForVA(t, client, va.Name, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached })
}

func TestRunFakeAttacherReturnsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunFakeAttacher(ctx, fake.NewClientset(), AttacherOptions{Delay: time.Hour}) }()
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Errorf("got %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunFakeAttacher did not return")
	}
}

// TestFakeAttacherCreates: with Node, the attacher plays the attach/detach
// controller: it creates and attaches the VolumeAttachment of each CSI PV
// whose driver needs attaching (CSIDriver attachRequired, or no CSIDriver),
// none for a driver with attachRequired: false, and deletes it with its PV.
func TestFakeAttacherCreates(t *testing.T) {
	needs := PV("pv-needs", PVSpec{Driver: "needs", Handle: "h1"})
	unknown := PV("pv-unknown", PVSpec{Driver: "unknown", Handle: "h2"}) // no CSIDriver: attachable, as for the controller
	never := PV("pv-never", PVSpec{Driver: "never", Handle: "h3"})
	client := fake.NewClientset(CSIDriver("needs", CSIDriverSpec{AttachRequired: true}), CSIDriver("never", CSIDriverSpec{}), needs, unknown, never)
	NewFakeAttacher(t, client, AttacherOptions{Node: "n1"})
	ctx := ctxFor(t)
	vaName := func(pv *v1.PersistentVolume) string {
		va, err := volumeAttachmentFor(pv, "n1")
		if err != nil {
			t.Fatal(err)
		}
		return va.Name
	}
	attached := func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached }
	for _, pv := range []*v1.PersistentVolume{needs, unknown} {
		va := waitForVA(t, client, vaName(pv), attached)
		if va.Spec.NodeName != "n1" || va.Spec.Attacher != pv.Spec.CSI.Driver || *va.Spec.Source.PersistentVolumeName != pv.Name {
			t.Errorf("VolumeAttachment of %s: spec %+v", pv.Name, va.Spec)
		}
	}
	// A PV created later is attached too; its handler runs after the
	// initial PVs', so by then never's was decided.
	later := PV("pv-later", PVSpec{Driver: "needs", Handle: "h4"})
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, later, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForVA(t, client, vaName(later), attached)
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vas.Items) != 3 {
		t.Errorf("%d VolumeAttachments, want 3 (none for the driver with attachRequired: false): %+v", len(vas.Items), vas.Items)
	}

	if err := client.CoreV1().PersistentVolumes().Delete(ctx, needs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.StorageV1().VolumeAttachments().Get(ctx, vaName(needs), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("VolumeAttachment of a deleted PV not deleted: %v", err)
	}
}
