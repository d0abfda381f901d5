package kubeletbench

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/kubelet/configmap"
	"k8s.io/kubernetes/pkg/kubelet/secret"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/csi"
	volumetest "k8s.io/kubernetes/pkg/volume/testing"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// W6, real pods: the kubelet's side of nodevol's BenchmarkRealPods
// (volumemanager/bench_realpods_test.go), on the same objects. Each pod
// has a kube-api-access projected volume (a token, kube-root-ca.crt's
// ca.crt, the namespace), a configMap and a secret of its own, an emptyDir
// and a CSI claim. The kubelet's volume host is the hand-over tests'
// (newVolumeHost) on the fake mounter, with the kubelet's default
// secret and configMap managers (the Watch change detection strategy:
// a watch per object a registered pod references) and its token manager.

// syncFrequency is the kubelet's default syncFrequency, the resync period
// of its secret and configMap managers.
const syncFrequency = time.Minute

// apiDefaultMode is the defaultMode the API server gives these volumes.
var apiDefaultMode int32 = 0o644

// kubeAPIAccess is the projected volume the ServiceAccount admission
// plugin adds to a pod.
func kubeAPIAccess(name string) v1.Volume {
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

// realPodObjects makes W6's objects as nodevol's side makes them (its
// realPodObjects: the CSIDriver, the node, kube-root-ca.crt and, per pod,
// a configMap, a secret and a bound claim) and the pods.
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
			csitest.WithVolume(v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
				LocalObjectReference: v1.LocalObjectReference{Name: config}, DefaultMode: &apiDefaultMode}}}, true),
			csitest.WithVolume(v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{
				SecretName: creds, DefaultMode: &apiDefaultMode}}}, true),
			csitest.WithVolume(v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, false),
			csitest.WithPVC("data", claim, false))
	}
	return objs, pods, pvs
}

// workloadPlugins returns the kubelet's volume plugins for w. W1 to W5: the
// CSI plugin alone on the test kit's host. W6: every plugin on
// newVolumeHost with fakes for the mounter and host utilities, its
// secrets and configMaps from the kubelet's watching managers, which pm
// tells of its pods.
func workloadPlugins(ctx context.Context, w workload, root string, client *fake.Clientset, nodeObj *v1.Node, pm *podManager) (*volume.VolumePluginMgr, error) {
	if !w.real {
		factory := informers.NewSharedInformerFactory(client, 0)
		driverLister := factory.Storage().V1().CSIDrivers().Lister()
		vaLister := factory.Storage().V1().VolumeAttachments().Lister()
		factory.Start(ctx.Done())
		factory.WaitForCacheSync(ctx.Done())
		host := volumetest.NewFakeKubeletVolumeHostWithCSINodeName(&testing.T{}, root, client, csi.ProbeVolumePlugins(), node, driverLister, vaLister)
		host.WithNode(nodeObj)
		return host.GetPluginMgr(), nil
	}
	secrets := secret.NewWatchingSecretManager(client, syncFrequency)
	configMaps := configmap.NewWatchingConfigMapManager(client, syncFrequency)
	pm.register = func(p *v1.Pod, present bool) {
		if present {
			secrets.RegisterPod(p)
			configMaps.RegisterPod(p)
		} else {
			secrets.UnregisterPod(p)
			configMaps.UnregisterPod(p)
		}
	}
	mounter := mount.NewFakeMounter(nil)
	host, err := newVolumeHost(ctx, &testing.T{}, hostConfig{root: root, client: client, node: nodeObj,
		mounter: mounter, hostUtil: hostutil.NewFakeHostUtil(nil), subpather: subpath.New(mounter),
		objects: &objectGetters{secret: secrets.GetSecret, configMap: configMaps.GetConfigMap}})
	if err != nil {
		return nil, fmt.Errorf("the kubelet's volume host in %s: %w", filepath.Base(root), err)
	}
	return host.pluginMgr, nil
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

// reportAPIByKind reports the requests per pod during the mount under the
// names nodevol's side uses: all of them as api/pod, each kind as
// api-{verb}-{resource}/pod (a subresource after a dot).
func reportAPIByKind(b *testing.B, counts map[string]int, pods float64) {
	total := 0
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		total += counts[k]
		unit := "api-" + strings.ReplaceAll(strings.ReplaceAll(k, " ", "-"), "/", ".") + "/pod"
		b.ReportMetric(float64(counts[k])/pods, unit)
	}
	b.ReportMetric(float64(total)/pods, "api/pod")
}

// BenchmarkRealPods is W6 on the kubelet: W1 and W2 on real pods,
// NODEVOL_BENCH_W6_PODS (comma separated; 100, 1,000 and 5,000 unset).
func BenchmarkRealPods(b *testing.B) {
	for _, n := range benchSizesFrom("NODEVOL_BENCH_W6_PODS", 100, 1000, 5000) {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, real: true}) })
	}
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
