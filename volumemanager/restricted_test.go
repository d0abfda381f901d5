package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
)

// restrictedClient is a fake clientset on which listing or watching claims,
// volumes and attachments is forbidden, as for a node under the Node
// authorizer.
func restrictedClient() *fake.Clientset {
	c := fake.NewClientset()
	for _, res := range []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"} {
		for _, verb := range []string{"list", "watch"} {
			c.PrependReactor(verb, res, func(a clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(v1.Resource(res), "", fmt.Errorf("node may not %s", verb))
			})
		}
	}
	return c
}

// TestObjectCacheMounts: by default (no Config.ClusterInformers), pods mount and
// unmount with one GET of each claim and volume (and polls of a
// VolumeAttachment until it is attached), and never a LIST or WATCH of
// them.
func TestObjectCacheMounts(t *testing.T) {
	e := newEnv(t, envOptions{client: restrictedClient()})
	var pods []*v1.Pod
	for i := range 3 {
		name := fmt.Sprintf("vol-%d", i)
		e.claim(name)
		pods = append(pods, csitest.Pod("ns", "p-"+name, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: name}}}))
	}
	for _, p := range pods {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		e.unmount(p)
	}
	gets := map[string]int{}
	for _, a := range e.client.Actions() {
		r := a.GetResource().Resource
		if r != "persistentvolumeclaims" && r != "persistentvolumes" && r != "volumeattachments" {
			continue
		}
		switch a.GetVerb() {
		case "get":
			gets[r]++
		case "create":
		default:
			t.Errorf("%s %s without Config.ClusterInformers", a.GetVerb(), r)
		}
	}
	if want := map[string]int{"persistentvolumeclaims": 3, "persistentvolumes": 3}; fmt.Sprint(gets) != fmt.Sprint(want) {
		t.Errorf("GETs %v, want %v: one per claim and volume", gets, want)
	}
}

// TestObjectCacheAttach: a VolumeAttachment is polled, not watched:
// the volume is staged once the attacher has set status.attached, and an
// attach error reaches WaitForAttachAndMount.
func TestObjectCacheAttach(t *testing.T) {
	e := newEnv(t, envOptions{client: restrictedClient(), attachRequired: true})
	e.claim("vol")
	vaName := csiplugin.AttachmentName("handle-vol", e.drv.DriverName(), node)
	va := csitest.VolumeAttachment(vaName, e.drv.DriverName(), "pv-vol", node, false)
	va.Status.AttachError = &storagev1.VolumeError{Message: "disk is on fire"}
	e.create(va)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	if err := e.mount(pod, 500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "disk is on fire") {
		t.Fatalf("WaitForAttachAndMount = %v, want the attach error", err)
	}
	if got := e.vm.objects.Holders(objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: vaName}); len(got) != 1 || !strings.HasPrefix(got[0], "volume ") {
		t.Fatalf("attachment held by %v, want the volume waiting for it", got)
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("%d NodeStageVolume before the attachment", n)
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Held by the volume while it waited, dropped once attached.
	vaRef := objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: vaName}
	eventually(t, "the attachment dropped once attached", func() bool {
		_, err := e.vm.objects.Peek(vaRef)
		return errors.Is(err, objectcache.ErrNotHeld)
	})
	e.unmount(pod)
}

// TestForbiddenListNamesClusterInformers: with Config.ClusterInformers, a
// forbidden list of claims says which mode a node's credentials need.
func TestForbiddenListNamesClusterInformers(t *testing.T) {
	vm, err := New(Config{NodeName: node, KubeClient: restrictedClient(), RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ClusterInformers: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the list error recorded", func() bool { return len(vm.listErrs.get()) > 0 })
	waitCtx, waitCancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer waitCancel()
	err = vm.WaitForAttachAndMount(waitCtx, csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "vol"},
	}}))
	for _, want := range []string{"forbidden", "Config.ClusterInformers", "leave it false"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

func gets(c *fake.Clientset, resource string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// TestObjectCacheHoldsWhatPodsUse: the claim and volume of running
// pods are held by those pods in the object cache; the claim is read
// again every resync period (to 1.5 periods) however long they run, the
// volume only when the claim changes (or a pod comes a period after its
// last read); both are dropped with the last pod that holds them, and no
// longer read.
func TestObjectCacheHoldsWhatPodsUse(t *testing.T) {
	const period = 20 * time.Millisecond
	e := newEnv(t, envOptions{client: restrictedClient(), resyncPeriod: period})
	pvName := e.claim("vol")
	claimRef := objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: "vol"}
	pvRef := objectcache.Ref{Kind: objectcache.PersistentVolume, Name: pvName}
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	for _, p := range []*v1.Pod{p1, p2} {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	both := []string{string(p1.UID), string(p2.UID)}
	slices.Sort(both)
	for _, r := range []objectcache.Ref{claimRef, pvRef} {
		if got := e.vm.objects.Holders(r); !slices.Equal(got, both) {
			t.Fatalf("%s held by %v, want both pods %v", r, got, both)
		}
	}
	// Held, not read: the claim refreshed every period, well beyond the
	// three periods after which an unread object was once dropped; the
	// volume read when first held and when p2 came, not with the claim.
	// (p2 read it again if it came a period or more after p1's read.)
	eventually(t, "the claim refreshed", func() bool { return gets(e.client, "persistentvolumeclaims") >= 10 })
	pvGets := gets(e.client, "persistentvolumes")
	if pvGets < 1 || pvGets > 2 {
		t.Fatalf("the volume read %d times for two pods, want once or twice", pvGets)
	}
	eventually(t, "the claim refreshed again", func() bool { return gets(e.client, "persistentvolumeclaims") >= 20 })
	if n := gets(e.client, "persistentvolumes"); n != pvGets {
		t.Fatalf("the volume read %d times, %d before ten more reads of its claim: it is not read with its unchanged claim", n, pvGets)
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "vol", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Labels = map[string]string{"changed": "yes"}
	if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").Update(context.Background(), pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume read again with its changed claim", func() bool { return gets(e.client, "persistentvolumes") == pvGets+1 })
	e.unmount(p1)
	eventually(t, "p1's holds released", func() bool { return slices.Equal(e.vm.objects.Holders(claimRef), []string{string(p2.UID)}) })
	if _, err := e.vm.objects.Peek(pvRef); err != nil {
		t.Fatalf("the volume while p2 holds it: %v", err)
	}
	e.unmount(p2)
	eventually(t, "the claim and volume dropped with the last pod", func() bool {
		_, errC := e.vm.objects.Peek(claimRef)
		_, errV := e.vm.objects.Peek(pvRef)
		return errors.Is(errC, objectcache.ErrNotHeld) && errors.Is(errV, objectcache.ErrNotHeld)
	})
}

// TestHoldObjectsAnnouncesFirstClaim: a pod's first hold of a claim that
// answers before the resolver reads it still gets the claim announced (a
// read marks it between the hold and the resolution), so that the pod is
// resolved again and then holds the claim's volume.
func TestHoldObjectsAnnouncesFirstClaim(t *testing.T) {
	pvc, pv := csitest.BoundClaim("ns", "c", csitest.PVSpec{Driver: "d.example.com", Handle: "h"})
	client := restrictedClient()
	for _, o := range []runtime.Object{pvc, pv} {
		if err := client.Tracker().Add(o); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	client.PrependReactor("get", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		<-gate
		return false, nil, nil
	})
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); vm.objects.Run(ctx) }()
	defer func() { cancel(); <-done }()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "c"}}})
	vm.holdObjects(pod.UID, pod)
	close(gate) // the claim answers after the hold, before any resolution
	claimRef := objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: "c"}
	if _, err := vm.objects.Get(ctx, claimRef); err != nil { // waits, and marks nothing
		t.Fatal(err)
	}
	eventually(t, "the claim announced", func() bool {
		return vm.in.ClaimPosted("ns/c")
	})
	vm.holdObjects(pod.UID, pod) // the pod resolved again
	pvRef := objectcache.Ref{Kind: objectcache.PersistentVolume, Name: pv.Name}
	if got := vm.objects.Holders(pvRef); !slices.Equal(got, []string{string(pod.UID)}) {
		t.Errorf("volume held by %v, want the pod", got)
	}
}

// TestObjectCacheTrims: the claims and volumes the object cache GETs
// are kept trimmed as the informers keep theirs, for as long as
// the pods hold them: without managedFields, and equal capacities shared
// by the claims and volumes of one size.
func TestObjectCacheTrims(t *testing.T) {
	e := newEnv(t, envOptions{client: restrictedClient()})
	managed := []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}}
	var pvs []string
	for _, name := range []string{"vol-a", "vol-b"} {
		pvc, pv := csitest.BoundClaim("ns", name, csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-" + name})
		pvc.ManagedFields, pv.ManagedFields = managed, managed
		e.create(pvc, pv)
		pvs = append(pvs, pv.Name)
		if err := e.mount(csitest.Pod("ns", "p-"+name, csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: name},
		}}), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var claims []*v1.PersistentVolumeClaim
	var volumes []*v1.PersistentVolume
	for i, name := range []string{"vol-a", "vol-b"} {
		pvc, err := peekAs[*v1.PersistentVolumeClaim](e.vm.objects, objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: name})
		if err != nil {
			t.Fatal(err)
		}
		pv, err := peekAs[*v1.PersistentVolume](e.vm.objects, objectcache.Ref{Kind: objectcache.PersistentVolume, Name: pvs[i]})
		if err != nil {
			t.Fatal(err)
		}
		if len(pvc.ManagedFields) > 0 || len(pv.ManagedFields) > 0 {
			t.Errorf("claim %s and its volume kept with %d and %d managedFields entries, want none", name, len(pvc.ManagedFields), len(pv.ManagedFields))
		}
		claims, volumes = append(claims, pvc), append(volumes, pv)
	}
	if !sameMap(claims[0].Status.Capacity, claims[1].Status.Capacity) || !sameMap(volumes[0].Spec.Capacity, volumes[1].Spec.Capacity) {
		t.Error("the capacities of two claims and volumes of one size are not shared")
	}
}

// peekAs reads one object of the object cache as type T.
func peekAs[T any](c *objectcache.Cache, r objectcache.Ref) (T, error) {
	var zero T
	o, err := c.Peek(r)
	if err != nil {
		return zero, err
	}
	return o.(T), nil
}
