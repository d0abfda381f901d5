package volumemanager

import (
	"errors"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestAttachmentsOnce: the one-time list of a self-attaching node without
// informers keeps this node's attachments and their volumes; a failed
// list is in the wait errors and retried with backoff; a forbidden one
// (the Node authorizer) ends it with nothing kept, so that the pods are
// not held back by it.
func TestAttachmentsOnce(t *testing.T) {
	_, pv := csitest.BoundClaim("ns", "c", csitest.PVSpec{Driver: "d.example.com", Handle: "h"})
	own := csitest.VolumeAttachment("own", "d.example.com", pv.Name, node, true)
	other := csitest.VolumeAttachment("other", "d.example.com", pv.Name, "node-2", true)
	for _, tc := range []struct {
		name     string
		failures int   // lists failing with an internal error first
		refuse   error // every list's error instead
		want     []string
	}{
		{name: "listed", want: []string{"own"}},
		{name: "listed after failures", failures: 2, want: []string{"own"}},
		{name: "forbidden", refuse: apierrors.NewForbidden(v1.Resource("volumeattachments"), "", errors.New("node may not list")), want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(pv, own, other)
			calls := 0
			client.PrependReactor("list", "volumeattachments", func(clienttesting.Action) (bool, runtime.Object, error) {
				calls++
				switch {
				case tc.refuse != nil:
					return true, nil, tc.refuse
				case calls <= tc.failures:
					return true, nil, apierrors.NewInternalError(errors.New("etcd is slow"))
				}
				return false, nil, nil
			})
			clk := testingclock.NewFakeClock(time.Now())
			errs := &listErrors{}
			a := newAttachmentsOnce(client, node, clk, errs)
			go a.run(t.Context())
			for range tc.failures {
				eventually(t, "a retry waiting", func() bool { return clk.HasWaiters() })
				if len(errs.get()) == 0 {
					t.Error("a failed list is not in the wait errors")
				}
				clk.Step(time.Minute)
			}
			select {
			case <-a.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the list did not end")
			}
			vas, _ := a.List(labels.Everything())
			var got []string
			for _, va := range vas {
				got = append(got, va.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("attachments %v, want %v", got, tc.want)
			}
			if _, err := a.Volume(pv.Name); (err == nil) != (tc.want != nil) {
				t.Errorf("volume %s: %v", pv.Name, err)
			}
			if len(errs.get()) != 0 {
				t.Errorf("wait errors %v left once listed", errs.get())
			}
		})
	}
}
