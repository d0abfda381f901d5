package volumemanager

import (
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// W6, real pods: the pods and objects of package bench/realpods, which
// bench/kubelet's side uses too.

// issueBenchToken answers a TokenRequest (create serviceaccounts/token) as
// the API server does: a token valid for the seconds asked, so that no
// refresh falls within a run.
func issueBenchToken(a k8stesting.Action) (bool, kruntime.Object, error) {
	create, ok := a.(k8stesting.CreateAction)
	if !ok || a.GetSubresource() != "token" {
		return false, nil, nil
	}
	tr, ok := create.GetObject().(*authenticationv1.TokenRequest)
	if !ok {
		return false, nil, nil
	}
	tr = tr.DeepCopy()
	seconds := int64(3600)
	if tr.Spec.ExpirationSeconds != nil {
		seconds = *tr.Spec.ExpirationSeconds
	}
	tr.Status = authenticationv1.TokenRequestStatus{Token: "bench-token",
		ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Duration(seconds) * time.Second))}
	return true, tr, nil
}

// BenchmarkRealPods is W6: W1 and W2 on pods with a kube-api-access
// volume, a configMap, a secret, an emptyDir and a CSI claim each
// (realPodObjects), NODEVOL_BENCH_W6_PODS (comma separated) pods.
func BenchmarkRealPods(b *testing.B) {
	for _, n := range w6Sizes() {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, real: true}) })
	}
}

// w6Sizes returns the pod counts of W6: NODEVOL_BENCH_W6_PODS, else 100,
// 1,000 and 5,000.
func w6Sizes() []int {
	return benchSizesFrom("NODEVOL_BENCH_W6_PODS", 100, 1000, 5000)
}
