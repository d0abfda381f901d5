package volumemanager

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume/projected"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// apiIssuer is testenv's --service-account-issuer, the API server's
// audience when a TokenRequest names none.
const apiIssuer = "https://kubernetes.default.svc.cluster.local"

// TestIntegrationTokenRefreshed runs a pod with the kube-api-access volume
// the API server adds to every pod (a token of the pod's service account,
// the CA from kube-root-ca.crt, the namespace), with the expirationSeconds
// the API server sets (3607) or the least it accepts (600), under the
// node's own credentials (the Node authorizer, NodeRestriction), the
// manager on a fake clock that the API server does not share. The token
// file holds a JWT bound to the pod, for the API server's audience, that
// the API server accepts. A resync before 80% of the token's life
// publishes the volume again without a TokenRequest and changes nothing; a
// resync once the clock has passed 80% makes one TokenRequest and switches
// ..data to a new token bound to the same pod, the CA and the namespace
// unchanged, a reader never seeing anything but one whole token.
func TestIntegrationTokenRefreshed(t *testing.T) {
	for _, seconds := range []int64{3607, 600} {
		t.Run(fmt.Sprintf("expirationSeconds=%d", seconds), func(t *testing.T) { testTokenRefreshed(t, seconds) })
	}
}

// testTokenRefreshed is TestIntegrationTokenRefreshed with a token of
// expirationSeconds seconds.
func testTokenRefreshed(t *testing.T, seconds int64) {
	clk := testclock.NewFakeClock(time.Now())
	reg := prometheus.NewRegistry()
	e := startObjectsEnvWith(t, func(c *Config) { c.Clock, c.Registerer, c.ResyncPeriod = clk, reg, time.Minute })
	ctx := t.Context()
	const sa, ca = "app", "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"
	if _, err := e.admin.CoreV1().ServiceAccounts(objectsNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createObjects(t, map[string]map[string]string{"kube-root-ca.crt": {"ca.crt": ca}}, nil)
	access := kubeAPIAccess("kube-api-access-7fq2m")
	access.Projected.Sources[0].ServiceAccountToken.ExpirationSeconds = &seconds
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, ServiceAccount: sa, Volumes: []csitest.PodVolume{
		{Name: access.Name, Source: access.VolumeSource, ReadOnly: true},
	}}))
	e.waitAuthorized(t, objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: objectsNS, Name: "kube-root-ca.crt"})
	e.waitTokenAuthorized(t, sa)
	e.mountPod(t, pod) // the fake clock never moves: no backoff would end, so this is the first attempt's success

	dir := e.volumeDir(pod, pluginDir(projected.PluginName), access.Name)
	first := readFile(filepath.Join(dir, "token"))
	claims := e.checkPodToken(t, first, pod, sa, seconds)
	files := volumeFiles(t, dir)
	if files["ca.crt"] != ca || files["namespace"] != objectsNS || files["token"] != first {
		t.Fatalf("the volume's files %q, want the token, ca.crt %q and namespace %q", files, ca, objectsNS)
	}
	if n := tokenRequests(t, e.log, sa); n != 1 {
		t.Fatalf("%d TokenRequests to mount the pod, want 1", n)
	}

	// Before 80% of the token's life: published again, from the cache.
	resyncAfter(t, e.vm, clk, time.Minute)
	if n := setUps(t, reg); n != 2 {
		t.Fatalf("%d publishes of the projected volume after a resync, want 2 (the mount, the resync's)", n)
	}
	if n := tokenRequests(t, e.log, sa); n != 1 {
		t.Errorf("%d TokenRequests after a resync a minute into the token's life, want still 1", n)
	}
	if got := volumeFiles(t, dir); !equalFiles(got, files) {
		t.Errorf("the volume after a resync a minute into the token's life: %q, want unchanged %q", got, files)
	}

	// Past 80% of the token's life (seconds from its iat, the API
	// server's clock, in whole seconds: a few seconds more), while a
	// reader reads the file: a new token.
	readerCtx, stopReader := context.WithCancel(ctx)
	defer stopReader()
	readerDone := make(chan string, 1)
	go func() { readerDone <- readTokens(readerCtx, filepath.Join(dir, "token"), first) }()
	due := time.Unix(claims.IssuedAt, 0).Add(time.Duration(seconds) * time.Second * 8 / 10).Add(5 * time.Second)
	resyncAfter(t, e.vm, clk, due.Sub(clk.Now()))
	stopReader()
	if bad := <-readerDone; bad != "" {
		t.Errorf("the reader of the token file: %s", bad)
	}
	if n := setUps(t, reg); n != 3 {
		t.Fatalf("%d publishes of the projected volume after two resyncs, want 3", n)
	}
	if n := tokenRequests(t, e.log, sa); n != 2 {
		t.Fatalf("%d TokenRequests after a resync past 80%% of the token's life, want 2", n)
	}
	refreshed := volumeFiles(t, dir)
	if refreshed["token"] == first {
		t.Fatal("the token file holds the first token after the refresh")
	}
	e.checkPodToken(t, refreshed["token"], pod, sa, seconds)
	if refreshed["ca.crt"] != ca || refreshed["namespace"] != objectsNS || refreshed["..data"] == files["..data"] {
		t.Errorf("the volume after the refresh: %q, want ..data switched from %q, ca.crt and namespace unchanged", refreshed, files["..data"])
	}
	e.checkNoRefusals(t)
	e.deletePod(t, pod)
	e.checkMounts(t)
}

// waitTokenAuthorized waits until the Node authorizer lets this node
// create tokens of service account sa (a pod of the node names it).
func (e *objectsEnv) waitTokenAuthorized(t *testing.T, sa string) {
	t.Helper()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: objectsNS, Verb: "create", Resource: "serviceaccounts",
			Subresource: "token", Name: sa},
	}}
	eventually(t, "the Node authorizer to allow tokens of service account "+sa, func() bool {
		r, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), review, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
}

// tokenClaims are the claims of a service account token that bind it.
type tokenClaims struct {
	Audience   []string `json:"aud"`
	IssuedAt   int64    `json:"iat"`
	Expiry     int64    `json:"exp"`
	Kubernetes struct {
		Namespace string `json:"namespace"`
		Pod       struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		ServiceAccount struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// checkPodToken checks that token is a JWT of service account sa bound to
// pod, for the API server's audience, valid for seconds at least (the API
// server extends a kube-api-access token of 3607 s to a year), and that
// the API server accepts it as that pod's (a TokenReview); it returns its
// claims.
func (e *objectsEnv) checkPodToken(t *testing.T, token string, pod *v1.Pod, sa string, seconds int64) tokenClaims {
	t.Helper()
	var c tokenClaims
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q: not a JWT", token)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err == nil {
		err = json.Unmarshal(payload, &c)
	}
	if err != nil {
		t.Fatalf("token's claims %q: %v", parts[1], err)
	}
	k := c.Kubernetes
	if k.Namespace != objectsNS || k.ServiceAccount.Name != sa || k.Pod.Name != pod.Name || k.Pod.UID != string(pod.UID) ||
		!slices.Contains(c.Audience, apiIssuer) || c.IssuedAt == 0 || c.Expiry < c.IssuedAt+seconds {
		t.Fatalf("token's claims %s, want service account %s/%s, pod %s (%s), audience %s, valid for %d s", payload, objectsNS, sa, pod.Name, pod.UID, apiIssuer, seconds)
	}
	review, err := e.admin.AuthenticationV1().TokenReviews().Create(t.Context(),
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := review.Status
	if wantUser := "system:serviceaccount:" + objectsNS + ":" + sa; !st.Authenticated || st.User.Username != wantUser ||
		!slices.Equal(st.User.Extra["authentication.kubernetes.io/pod-uid"], authenticationv1.ExtraValue{string(pod.UID)}) {
		t.Fatalf("the API server's review of the token: %+v, want %s of pod %s", st, wantUser, pod.UID)
	}
	return c
}

// volumeFiles returns what a container sees of a kube-api-access volume:
// token, ca.crt and namespace (each a link to ..data/ its name), and
// ..data's target.
func volumeFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, name := range []string{"token", "ca.crt", "namespace"} {
		if target, err := os.Readlink(filepath.Join(dir, name)); err != nil || target != "..data/"+name {
			t.Errorf("%s links to %q (%v), want ..data/%s", name, target, err, name)
		}
		files[name] = readFile(filepath.Join(dir, name))
	}
	data, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	files["..data"] = data
	return files
}

// equalFiles compares two volumeFiles.
func equalFiles(a, b map[string]string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// tokenRequests counts the log's TokenRequests of service account sa that
// the API server granted.
func tokenRequests(t *testing.T, log *requestLog, sa string) int {
	t.Helper()
	n := 0
	for _, r := range log.requests("serviceaccounts/token") {
		if r.verb != http.MethodPost || r.namespace != objectsNS || r.name != sa || r.status != http.StatusCreated {
			t.Errorf("unexpected token request %v", r)
			continue
		}
		n++
	}
	return n
}

// resyncAfter moves the manager's clock d ahead, which fires the resync
// ticker, and waits until the loop has resynced and finished what the
// resync started.
func resyncAfter(t *testing.T, vm *VolumeManager, clk *testclock.FakeClock, d time.Duration) {
	t.Helper()
	before := resyncCount(vm)
	eventually(t, "the resync ticker", clk.HasWaiters)
	clk.Step(d)
	eventually(t, "a resync", func() bool { return resyncCount(vm) > before })
	waitIdle(t, vm)
}

// resyncCount returns the loop's resyncs so far, read on its goroutine.
func resyncCount(vm *VolumeManager) int {
	n := make(chan int, 1)
	vm.inspect <- func(l *reconciler.Loop) { n <- l.Resyncs() }
	return <-n
}

// setUps counts the projected volumes' successful publishes
// (storage_operation_duration_seconds, volume_mount).
func setUps(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() != "storage_operation_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["volume_plugin"] == projected.PluginName && labels["operation_name"] == "volume_mount" && labels["status"] == "success" {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// readTokens reads the token file until ctx ends, and says what was wrong
// with the first read that failed or held neither first nor one other
// whole token (a JWT of three parts), or that held first after another.
func readTokens(ctx context.Context, path, first string) (bad string) {
	var other string
	for reads := 0; ctx.Err() == nil; reads++ {
		b, err := os.ReadFile(path)
		tok := string(b)
		switch {
		case err != nil:
			return fmt.Sprintf("read %d: %v", reads, err)
		case tok == first && other != "":
			return fmt.Sprintf("read %d: the first token after a new one", reads)
		case tok == first:
		case strings.Count(tok, ".") != 2 || other != "" && tok != other:
			return fmt.Sprintf("read %d: %d bytes, neither the first token nor one whole new token", reads, len(tok))
		default:
			other = tok
		}
	}
	return ""
}
