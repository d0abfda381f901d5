package csiplugin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

// fakeTokens issues "token-N" for each request and records the requests.
type fakeTokens struct {
	reqs []*authenticationv1.TokenRequest
	sa   []string
	err  error
}

func (f *fakeTokens) ServiceAccountToken(_ context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	if f.err != nil {
		return nil, f.err
	}
	f.reqs = append(f.reqs, tr)
	f.sa = append(f.sa, namespace+"/"+name)
	out := tr.DeepCopy()
	out.Status = authenticationv1.TokenRequestStatus{Token: "token-" + tr.Spec.Audiences[0], ExpirationTimestamp: metav1.Unix(1e9, 0)}
	return out, nil
}

// TestServiceAccountTokens: a driver whose CSIDriver lists tokenRequests
// gets the pod's tokens, bound to the pod, as a JSON map by audience, in
// the volume context or (serviceAccountTokenInSecrets) in the secrets; the
// PV's own volume attributes are not changed.
func TestServiceAccountTokens(t *testing.T) {
	exp := int64(3600)
	requests := []storagev1.TokenRequest{{Audience: "vault", ExpirationSeconds: &exp}, {Audience: "aws"}}
	tests := []struct {
		name      string
		inSecrets bool
	}{
		{name: "volume context"},
		{name: "secrets", inSecrets: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := csitest.CSIDriver(drv, csitest.CSIDriverSpec{})
			d.Spec.TokenRequests = requests
			if tt.inSecrets {
				d.Spec.ServiceAccountTokenInSecrets = new(true)
			}
			e := newEnv(t, envOptions{objects: []runtime.Object{d}, driver: csitest.Options{NoStageUnstage: true, CreateTargetDirs: true}})
			tokens := &fakeTokens{}
			e.p.tokens = tokens
			spec := testSpec(drv)
			spec.Attributes = map[string]string{"a": "b"}
			vol := podVolume("a", "data")
			if _, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
				t.Fatal(err)
			}
			req := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
			where, other := req.GetVolumeContext(), req.GetSecrets()
			if tt.inSecrets {
				where, other = other, where
			}
			var got map[string]authenticationv1.TokenRequestStatus
			if err := json.Unmarshal([]byte(where[serviceAccountTokensKey]), &got); err != nil {
				t.Fatalf("%s = %q: %v", serviceAccountTokensKey, where[serviceAccountTokensKey], err)
			}
			if len(got) != 2 || got["vault"].Token != "token-vault" || got["aws"].Token != "token-aws" {
				t.Errorf("tokens = %+v, want vault and aws", got)
			}
			if _, ok := other[serviceAccountTokensKey]; ok {
				t.Errorf("tokens in both the volume context and the secrets")
			}
			if len(spec.Attributes) != 1 {
				t.Errorf("the spec's attributes were changed: %v", spec.Attributes)
			}
			if len(tokens.reqs) != 2 {
				t.Fatalf("%d token requests, want 2", len(tokens.reqs))
			}
			r := tokens.reqs[0]
			if tokens.sa[0] != "ns/sa" || r.Spec.BoundObjectRef.UID != vol.Pod.UID || r.Spec.BoundObjectRef.Kind != "Pod" ||
				r.Spec.BoundObjectRef.Name != vol.Pod.Name || *r.Spec.ExpirationSeconds != exp {
				t.Errorf("token request for %s: %+v, want bound to pod %s for 3600s", tokens.sa[0], r.Spec, vol.Pod.Name)
			}
		})
	}
}

// TestServiceAccountTokenFailure: a token that cannot be had is a final
// error naming the service account, and NodePublishVolume is not called.
func TestServiceAccountTokenFailure(t *testing.T) {
	d := csitest.CSIDriver(drv, csitest.CSIDriverSpec{})
	d.Spec.TokenRequests = []storagev1.TokenRequest{{Audience: "vault"}}
	e := newEnv(t, envOptions{objects: []runtime.Object{d}, driver: csitest.Options{NoStageUnstage: true, CreateTargetDirs: true}})
	e.p.tokens = &fakeTokens{err: errors.New("forbidden")}
	_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: podVolume("a", "data")})
	if err == nil || volume.IsUncertain(err) || !contains(err.Error(), "service account ns/sa", "forbidden") {
		t.Fatalf("SetUp = %v, want a final error naming the service account", err)
	}
	if n := e.srv.Calls("NodePublishVolume"); n != 0 {
		t.Errorf("NodePublishVolume called %d times", n)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
