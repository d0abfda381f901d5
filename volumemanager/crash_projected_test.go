package volumemanager

import (
	"context"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/bench/realpods"
	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// The crash-point scenarios of a projected volume, the kube-api-access-*
// volume the API server adds to every pod: a service account token (from
// the fake API server's TokenRequest reactor), the cluster's CA from the
// configMap kube-root-ca.crt and the namespace from the downward API, on a
// tmpfs. Set up, torn down, and written again after the CA changed; before
// every step the pod's files are one version (readers: the old CA or the
// new, with the token and the namespace, never a mix), every file there
// once the pod runs; after every crash and restart the node is exactly as
// a run without a crash leaves it, the tmpfs mounted once
// (crashNode.mountEntries counts), nothing left after the teardown.

// The kube-api-access volume's files.
const (
	accessToken     = "token-of-api"
	accessCA1       = "-----CA 1-----\n"
	accessCA2       = "-----CA 2-----\n"
	accessNamespace = "ns"
)

// projectedScenarios are the projected volume's scenarios; add and del
// are crashScenarios'.
func projectedScenarios(add, del func(*v1.Pod) func(*VolumeManager, *crashNode)) []crashScenario {
	api := csitest.Pod("ns", "api", csitest.PodSpec{ServiceAccount: "app", Volumes: []csitest.PodVolume{
		withKubeAPIAccess("kube-api-access-4xk2q"),
	}})
	opts := csitest.Options{CreateTargetDirs: true}
	objects := func(string, string) []runtime.Object {
		return []runtime.Object{&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"},
			Data: map[string]string{"ca.crt": accessCA1}}}
	}
	return []crashScenario{
		{name: "projected-setup", opts: opts, objects: objects, node: crashNodeObject(), prepare: issueTokens,
			after: []*v1.Pod{api}, act: add(api)},
		{name: "projected-teardown", opts: opts, objects: objects, node: crashNodeObject(), prepare: issueTokens,
			before: []*v1.Pod{api}, other: []*v1.Pod{api}, act: del(api)},
		// The other choice: the pod deleted while the agent was down,
		// its half-updated volume torn down.
		{name: "projected-update", opts: opts, objects: objects, node: crashNodeObject(), prepare: issueTokens,
			before: []*v1.Pod{api}, after: []*v1.Pod{api},
			act:     updateConfigMap("kube-root-ca.crt", map[string]string{"ca.crt": accessCA2}),
			settled: holds(api, "kubernetes.io~projected", "kube-api-access-4xk2q", "ca.crt", accessCA2)},
	}
}

// withKubeAPIAccess is the API server's kube-api-access volume, named
// vol, mounted read-only.
func withKubeAPIAccess(vol string) csitest.PodVolume {
	v := kubeAPIAccess(vol)
	return csitest.PodVolume{Name: v.Name, Source: v.VolumeSource, ReadOnly: true}
}

// issueTokens makes the node's API server issue accessToken for every
// TokenRequest, valid for an hour (no refresh within a run), and tells the
// readers what a kube-api-access volume shows of each kube-root-ca.crt.
// Every manager of a run, each with its own token cache, is handed the
// same token, as each restarted kubelet gets a token of its own: the file
// is the same either way.
func issueTokens(n *crashNode) {
	n.client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr.Status = authenticationv1.TokenRequestStatus{Token: accessToken, ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
		return true, tr, nil
	})
	n.readers.project = func(cm *v1.ConfigMap) map[string]string {
		if cm.Name != "kube-root-ca.crt" {
			return nil
		}
		return map[string]string{"token": accessToken, "ca.crt": cm.Data["ca.crt"], "namespace": accessNamespace}
	}
}

// projectedNames are the file names of a projected volume's sources: the
// token's path, the configMaps' and secrets' keys or items, the downward
// API items.
func (n *crashNode) projectedNames(ctx context.Context, p *v1.Pod, src *v1.ProjectedVolumeSource) ([]string, error) {
	var names []string
	for _, s := range src.Sources {
		var more []string
		var err error
		switch {
		case s.ServiceAccountToken != nil:
			more = []string{s.ServiceAccountToken.Path}
		case s.ConfigMap != nil:
			more, err = n.objectKeys(ctx, p.Namespace, s.ConfigMap.Name, true, s.ConfigMap.Items)
		case s.Secret != nil:
			more, err = n.objectKeys(ctx, p.Namespace, s.Secret.Name, false, s.Secret.Items)
		case s.DownwardAPI != nil:
			more = itemPaths(s.DownwardAPI.Items)
		}
		if err != nil {
			return nil, err
		}
		names = append(names, more...)
	}
	return names, nil
}

// kubeAPIAccess is the projected volume the ServiceAccount admission
// plugin adds to a pod.
var kubeAPIAccess = realpods.KubeAPIAccess
