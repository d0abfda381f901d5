package volumemanager

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// W6, real pods: each pod has the volumes a pod of a Deployment has on a
// real cluster, five of them. bench/kubelet makes the same objects for the
// kubelet's side (realPodObjects there: a separate module, so its own copy
// of this one; keep the two alike).
//
//	kube-api-access-*  projected, as the ServiceAccount admission plugin writes it:
//	                   a token for the pod's service account, ca.crt of configMap
//	                   kube-root-ca.crt, the namespace from the downward API
//	config             configMap app-config-{i}, the pod's own
//	creds              secret app-creds-{i}, the pod's own
//	scratch            an emptyDir on disk
//	data               claim claim-{i}, bound to a CSI volume of the driver

// realPodObjects makes the API objects and the pods of W6: the CSIDriver,
// the node, the namespace's kube-root-ca.crt and, per pod, a configMap, a secret
// and a bound claim.
func realPodObjects(n int, driver string) ([]kruntime.Object, []*v1.Pod, []*v1.PersistentVolume) {
	objs := []kruntime.Object{
		csitest.CSIDriver(driver, false),
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"},
			Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\nthe cluster's CA\n-----END CERTIFICATE-----\n"}},
	}
	pods := make([]*v1.Pod, n)
	pvs := make([]*v1.PersistentVolume, n)
	for i := range pods {
		config, creds, claim := fmt.Sprintf("app-config-%d", i), fmt.Sprintf("app-creds-%d", i), fmt.Sprintf("claim-%d", i)
		pvc, pv := csitest.BoundClaim("ns", claim, driver, "handle-"+claim, csitest.PVAccessModes(v1.ReadWriteMany))
		objs = append(objs, pvc, pv,
			&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: config}, Data: map[string]string{"app.conf": "replicas=3\nlevel=info\n"}},
			csitest.Secret("ns", creds, map[string]string{"username": "app", "password": "hunter2"}))
		pvs[i] = pv
		pods[i] = csitest.Pod("ns", fmt.Sprintf("pod-%d", i), csitest.PodServiceAccount("default"),
			csitest.WithVolume(kubeAPIAccess(fmt.Sprintf("kube-api-access-%05d", i)), true),
			withConfigMap("config", config), withSecret("creds", creds),
			csitest.WithVolume(v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, false),
			csitest.WithPVC("data", claim, false))
	}
	return objs, pods, pvs
}

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

// countActions counts the requests by "verb resource[/subresource]".
func countActions(actions []k8stesting.Action) map[string]int {
	out := map[string]int{}
	for _, a := range actions {
		res := a.GetResource().Resource
		if sub := a.GetSubresource(); sub != "" {
			res += "/" + sub
		}
		out[a.GetVerb()+" "+res]++
	}
	return out
}

// addCounts adds b's counts to a, which it returns (made if nil).
func addCounts(a, b map[string]int) map[string]int {
	if a == nil {
		a = map[string]int{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// reportAPIByKind reports the requests per pod during the mount: all of
// them as api/pod, and each kind as api-{verb}-{resource}/pod (a
// subresource after a dot: api-create-serviceaccounts.token/pod).
func reportAPIByKind(b *testing.B, counts map[string]int, pods float64) {
	total := 0
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		total += counts[k]
		unit := "api-" + strings.ReplaceAll(strings.ReplaceAll(k, " ", "-"), "/", ".") + "/pod"
		b.ReportMetric(float64(counts[k])/pods, unit)
	}
	b.ReportMetric(float64(total)/pods, "api/pod")
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

// serveByName makes the client answer a list or watch of configMaps or
// secrets with the field selector metadata.name=NAME as the API server
// does, with that one object and its changes only: the fake tracker ignores
// field selectors, so that each per-object read of both sides (the
// kubelet's watching managers, nodevol's object cache) would list every
// configMap of the namespace, N objects for each of N pods, and hear of
// every change. Call it before the client is used: its reactor chain is
// not safe to change while in use.
func serveByName(client *fake.Clientset) {
	for _, res := range []string{"configmaps", "secrets"} {
		client.PrependReactor("list", res, func(a k8stesting.Action) (bool, kruntime.Object, error) {
			l, ok := a.(k8stesting.ListAction)
			if !ok {
				return false, nil, nil
			}
			name, ok := l.GetListRestrictions().Fields.RequiresExactMatch("metadata.name")
			if !ok {
				return false, nil, nil
			}
			obj, err := client.Tracker().Get(a.GetResource(), a.GetNamespace(), name)
			if err != nil && !apierrors.IsNotFound(err) {
				return true, nil, err
			}
			// The watch below ignores the resourceVersion: it hears the
			// changes made from now on.
			meta := metav1.ListMeta{ResourceVersion: "1"}
			switch o := obj.(type) {
			case *v1.ConfigMap:
				return true, &v1.ConfigMapList{ListMeta: meta, Items: []v1.ConfigMap{*o}}, nil
			case *v1.Secret:
				return true, &v1.SecretList{ListMeta: meta, Items: []v1.Secret{*o}}, nil
			case nil:
				if res == "secrets" {
					return true, &v1.SecretList{ListMeta: meta}, nil
				}
				return true, &v1.ConfigMapList{ListMeta: meta}, nil
			}
			return true, nil, fmt.Errorf("listing %s %s/%s: unexpected %T", res, a.GetNamespace(), name, obj)
		})
		client.PrependWatchReactor(res, func(a k8stesting.Action) (bool, watch.Interface, error) {
			w, ok := a.(k8stesting.WatchAction)
			if !ok {
				return false, nil, nil
			}
			name, ok := w.GetWatchRestrictions().Fields.RequiresExactMatch("metadata.name")
			if !ok {
				return false, nil, nil
			}
			all, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
			if err != nil {
				return true, nil, err
			}
			return true, watch.Filter(all, func(e watch.Event) (watch.Event, bool) {
				m, err := apimeta.Accessor(e.Object)
				return e, err == nil && m.GetName() == name
			}), nil
		})
	}
}
