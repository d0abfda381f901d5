package resolve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
)

// TestCachedListers: by default a pod holds its claims (a
// generic ephemeral volume's too); a read before the first answer does
// not wait and says so, the answer is announced, and the claim found
// bound adds its volume to what the pod holds. Lists are refused.
func TestCachedListers(t *testing.T) {
	pvc, pv := csitest.BoundClaim("ns", "c", csitest.PVSpec{Driver: "d.example.com", Handle: "h"})
	client := restrictedClient()
	for _, o := range []runtime.Object{pvc, pv} {
		if err := client.Tracker().Add(o); err != nil {
			t.Fatal(err)
		}
	}
	changed := make(chan objectcache.Ref, 10)
	c := objectcache.New(objectcache.Config{Client: client, OnChange: func(r objectcache.Ref) { changed <- r }})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "c"}}})
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}})
	claimRef := objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: "c"}
	want := []objectcache.Ref{claimRef, {Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: "p-scratch"}}
	if got := ClaimRefs(c, pod); !slices.Equal(got, want) {
		t.Fatalf("refs %v, want %v", got, want)
	}
	c.Hold("p", want...)
	l := cachedPVCs{c}.PersistentVolumeClaims("ns")
	if _, err := l.Get("c"); !errors.Is(err, objectcache.ErrNotAnswered) || !strings.Contains(err.Error(), "PersistentVolumeClaim ns/c") {
		t.Fatalf("read before the first answer: %v, want not answered, naming the claim", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case r := <-changed:
		if r != claimRef {
			t.Fatalf("announced %s, want the claim read before its answer", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's first answer was not announced")
	}
	if got, err := l.Get("c"); err != nil || got.Name != "c" {
		t.Fatalf("read after the answer: %v, %v", got, err)
	}
	pvRef := objectcache.Ref{Kind: objectcache.PersistentVolume, Name: pv.Name}
	if got := ClaimRefs(c, pod); !slices.Contains(got, pvRef) {
		t.Errorf("refs %v once the claim is known bound: want its volume %s", got, pv.Name)
	}
	for _, err := range []error{
		func() error { _, err := (cachedPVCs{c}).List(labels.Everything()); return err }(),
		func() error { _, err := l.List(labels.Everything()); return err }(),
		func() error { _, err := (cachedPVs{c}).List(labels.Everything()); return err }(),
		func() error { _, err := (cachedVAs{c}).List(labels.Everything()); return err }(),
	} {
		if !errors.Is(err, errNoList) {
			t.Errorf("List: %v, want refused", err)
		}
	}
}

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
