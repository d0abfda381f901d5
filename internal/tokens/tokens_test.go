package tokens

import (
	"context"
	"errors"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testclock "k8s.io/utils/clock/testing"
)

// TestTokenCache: a token is reused until 80% of its lifetime has passed,
// then a new one is requested; other audiences and pods get their own.
func TestTokenCache(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1000, 0))
	client := fake.NewClientset()
	created := 0
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		created++
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr.Status = authenticationv1.TokenRequestStatus{
			Token:               "t" + string(rune('0'+created)),
			ExpirationTimestamp: metav1.NewTime(clk.Now().Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second)),
		}
		return true, tr, nil
	})
	g := New(client, clk)
	req := func(aud, pod string) *authenticationv1.TokenRequest {
		exp := int64(1000)
		return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{aud}, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: pod, UID: "uid-" + types.UID(pod)},
		}}
	}
	get := func(aud, pod string) string {
		t.Helper()
		tr, _, err := g.ServiceAccountToken(context.Background(), "ns", "sa", req(aud, pod))
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	steps := []struct {
		advance   time.Duration
		aud, pod  string
		want      string
		wantCalls int
	}{
		{aud: "a", pod: "p", want: "t1", wantCalls: 1},
		{advance: 700 * time.Second, aud: "a", pod: "p", want: "t1", wantCalls: 1},
		{aud: "b", pod: "p", want: "t2", wantCalls: 2},
		{aud: "a", pod: "q", want: "t3", wantCalls: 3},
		{advance: 101 * time.Second, aud: "a", pod: "p", want: "t4", wantCalls: 4}, // 801s of 1000s
		{aud: "a", pod: "p", want: "t4", wantCalls: 4},
	}
	for i, s := range steps {
		clk.Step(s.advance)
		if got := get(s.aud, s.pod); got != s.want || created != s.wantCalls {
			t.Errorf("step %d: token %q after %d requests, want %q after %d", i, got, created, s.want, s.wantCalls)
		}
	}
}

// issuing is a fake clientset whose TokenRequests expire expirationSeconds
// after clk's now, with tokens t1, t2, ... counted in *created.
func issuing(clk *testclock.FakeClock, created *int) *fake.Clientset {
	client := fake.NewClientset()
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*created++
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr.Status = authenticationv1.TokenRequestStatus{
			Token:               "t" + string(rune('0'+*created)),
			ExpirationTimestamp: metav1.NewTime(clk.Now().Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second)),
		}
		return true, tr, nil
	})
	return client
}

func request(exp int64, pod types.UID) *authenticationv1.TokenRequest {
	return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"a"}, ExpirationSeconds: &exp,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: "p", UID: pod},
	}}
}

// TestRefreshAt: a token is due at 80% of its lifetime, at most 24 hours
// after it was issued, and handed out again until then.
func TestRefreshAt(t *testing.T) {
	for _, tt := range []struct {
		exp  int64
		want time.Duration
	}{
		{3600, 48 * time.Minute},
		{7 * 24 * 3600, MaxAge},
	} {
		clk := testclock.NewFakeClock(time.Unix(1000, 0))
		created := 0
		c := New(issuing(clk, &created), clk)
		_, at, err := c.ServiceAccountToken(context.Background(), "ns", "sa", request(tt.exp, "u"))
		if err != nil || at.Sub(clk.Now()) != tt.want {
			t.Errorf("expirationSeconds %d: refresh after %v, %v; want %v", tt.exp, at.Sub(clk.Now()), err, tt.want)
		}
		clk.Step(tt.want - time.Second)
		if _, again, _ := c.ServiceAccountToken(context.Background(), "ns", "sa", request(tt.exp, "u")); !again.Equal(at) || created != 1 {
			t.Errorf("expirationSeconds %d: before the refresh, %d requests (refresh at %v), want the first token", tt.exp, created, again)
		}
	}
}

// TestForget: the tokens of a pod that is gone are dropped; the next
// request for it issues a new one.
func TestForget(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1000, 0))
	created := 0
	c := New(issuing(clk, &created), clk)
	ctx := context.Background()
	for _, pod := range []types.UID{"u1", "u2", "u1"} {
		if _, _, err := c.ServiceAccountToken(ctx, "ns", "sa", request(3600, pod)); err != nil {
			t.Fatal(err)
		}
	}
	c.Forget("u1")
	c.ServiceAccountToken(ctx, "ns", "sa", request(3600, "u2"))
	c.ServiceAccountToken(ctx, "ns", "sa", request(3600, "u1"))
	if created != 3 {
		t.Errorf("%d tokens issued, want 3 (u1, u2, u1 again after Forget)", created)
	}
}

// TestRefreshFails: a refresh the API server refuses hands out the token
// held while it has not expired, due again at once (its refreshAt), as the
// kubelet's token manager does; once it has expired, the refusal is the
// error. A refresh that succeeds later replaces it.
func TestRefreshFails(t *testing.T) {
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts/token"}, "sa", errors.New("no"))
	for _, tt := range []struct {
		name      string
		advance   time.Duration // from the first token's issue, of 1000 s
		wantToken string        // "" for an error
	}{
		{name: "due, not expired", advance: 900 * time.Second, wantToken: "t1"},
		{name: "expired", advance: 1000 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := testclock.NewFakeClock(time.Unix(1000, 0))
			created := 0
			client := issuing(clk, &created)
			c := New(client, clk)
			ctx := context.Background()
			_, firstAt, err := c.ServiceAccountToken(ctx, "ns", "sa", request(1000, "u"))
			if err != nil {
				t.Fatal(err)
			}
			client.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, refused
			})
			clk.Step(tt.advance)
			tr, at, err := c.ServiceAccountToken(ctx, "ns", "sa", request(1000, "u"))
			switch {
			case tt.wantToken == "" && !apierrors.IsForbidden(err):
				t.Fatalf("refresh refused after the token expired: %v, want the refusal", err)
			case tt.wantToken != "" && (err != nil || tr.Status.Token != tt.wantToken || !at.Equal(firstAt)):
				t.Fatalf("refresh refused before the token expired: %v, %v (refresh at %v), want %s due at %v", tr, err, at, tt.wantToken, firstAt)
			}
			client.ReactionChain = client.ReactionChain[1:] // the API server issues again
			if tr, _, err := c.ServiceAccountToken(ctx, "ns", "sa", request(1000, "u")); err != nil || tr.Status.Token != "t2" {
				t.Errorf("the next call, the API server issuing: %v, %v; want a new token t2", tr, err)
			}
		})
	}
}
