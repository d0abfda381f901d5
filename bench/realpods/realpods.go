// Package realpods holds what both sides of workload W6 (real pods) share:
// nodevol's BenchmarkRealPods (volumemanager) and the kubelet's
// (bench/kubelet, a separate module that requires this one). Each pod has
// the volumes a pod of a Deployment has on a real cluster:
//
//	kube-api-access-*  projected, as the ServiceAccount admission plugin writes it:
//	                   a token for the pod's service account, ca.crt of configMap
//	                   kube-root-ca.crt, the namespace from the downward API
//	config             configMap app-config-{i}, the pod's own
//	creds              secret app-creds-{i}, the pod's own
//	scratch            an emptyDir on disk
//	data               claim claim-{i}, bound to a CSI volume of the driver
//
// It also makes a fake clientset answer as the API server does where both
// sides' requests depend on it, and counts those requests.
package realpods

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

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

// apiDefaultMode is the defaultMode the API server gives these volumes.
var apiDefaultMode int32 = 0o644

// KubeAPIAccess is the projected volume the ServiceAccount admission
// plugin adds to a pod, named name.
func KubeAPIAccess(name string) v1.Volume {
	expiry := int64(3607)
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
		DefaultMode: &apiDefaultMode,
		Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		}}}}
}

// Objects makes the API objects and the pods of n real pods on node: the
// CSIDriver of driver (no attach), the Node, the namespace's
// kube-root-ca.crt and, per pod, a configMap, a secret and a claim bound to
// a PV of driver, which it returns too.
func Objects(n int, node, driver string) ([]kruntime.Object, []*v1.Pod, []*v1.PersistentVolume) {
	objs := []kruntime.Object{
		csitest.CSIDriver(driver, csitest.CSIDriverSpec{}),
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"},
			Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\nthe cluster's CA\n-----END CERTIFICATE-----\n"}},
	}
	pods := make([]*v1.Pod, n)
	pvs := make([]*v1.PersistentVolume, n)
	for i := range pods {
		config, creds, claim := fmt.Sprintf("app-config-%d", i), fmt.Sprintf("app-creds-%d", i), fmt.Sprintf("claim-%d", i)
		pvc, pv := csitest.BoundClaim("ns", claim, csitest.PVSpec{
			Driver:      driver,
			Handle:      "handle-" + claim,
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
		})
		objs = append(objs, pvc, pv,
			&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: config}, Data: map[string]string{"app.conf": "replicas=3\nlevel=info\n"}},
			csitest.Secret("ns", creds, map[string]string{"username": "app", "password": "hunter2"}))
		pvs[i] = pv
		access := KubeAPIAccess(fmt.Sprintf("kube-api-access-%05d", i))
		pods[i] = csitest.Pod("ns", fmt.Sprintf("pod-%d", i), csitest.PodSpec{ServiceAccount: "default", Volumes: []csitest.PodVolume{
			{Name: access.Name, Source: access.VolumeSource, ReadOnly: true},
			{Name: "config", Source: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
				LocalObjectReference: v1.LocalObjectReference{Name: config}, DefaultMode: &apiDefaultMode}}, ReadOnly: true},
			{Name: "creds", Source: v1.VolumeSource{Secret: &v1.SecretVolumeSource{
				SecretName: creds, DefaultMode: &apiDefaultMode}}, ReadOnly: true},
			{Name: "scratch", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			{Name: "data", Claim: claim},
		}})
	}
	return objs, pods, pvs
}

// CountActions counts the requests by "verb resource[/subresource]".
func CountActions(actions []k8stesting.Action) map[string]int {
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

// AddCounts adds b's counts to a, which it returns (made if nil).
func AddCounts(a, b map[string]int) map[string]int {
	if a == nil {
		a = map[string]int{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// ReportByKind reports the requests per pod: all of them as api/pod, and
// each kind as api-{verb}-{resource}/pod (a subresource after a dot:
// api-create-serviceaccounts.token/pod), under the same names on both sides.
func ReportByKind(b *testing.B, counts map[string]int, pods float64) {
	total := 0
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		total += counts[k]
		unit := "api-" + strings.ReplaceAll(strings.ReplaceAll(k, " ", "-"), "/", ".") + "/pod"
		b.ReportMetric(float64(counts[k])/pods, unit)
	}
	b.ReportMetric(float64(total)/pods, "api/pod")
}

// ServeByName makes the client answer a list or watch of configMaps or
// secrets with the field selector metadata.name=NAME as the API server
// does, with that one object and its changes only: the fake tracker ignores
// field selectors, so that each per-object read of both sides (the
// kubelet's watching managers, nodevol's object cache) would list every
// configMap of the namespace, N objects for each of N pods, and hear of
// every change. Call it before the client is used: its reactor chain is
// not safe to change while in use.
func ServeByName(client *fake.Clientset) {
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
