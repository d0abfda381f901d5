package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/nodevol/nodevol/testenv"
)

// baselineCluster is an admission configuration that makes Pod Security
// admission enforce, audit and warn the baseline level wherever a
// namespace's labels do not say otherwise: a cluster set up as many are.
const baselineCluster = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults:
        enforce: baseline
        enforce-version: latest
        audit: baseline
        audit-version: latest
        warn: baseline
        warn-version: latest
`

// warnings collects the API server's warnings (the Warning headers), as
// kubectl prints them.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// TestIntegrationDeployManifests applies every manifest of deploy/ as it
// is (server-side apply of the YAML, the DaemonSets as a dry run: both
// variants have one name) to a real kube-apiserver whose Pod Security
// admission enforces the baseline level by default. Each is accepted with
// no warning. A pod made from each DaemonSet's template is admitted in the
// manifests' own namespace (its privileged label) and rejected by Pod
// Security admission in a namespace that has no label and in one labelled
// baseline.
func TestIntegrationDeployManifests(t *testing.T) {
	config := filepath.Join(t.TempDir(), "admission.yaml")
	if err := os.WriteFile(config, []byte(baselineCluster), 0o600); err != nil {
		t.Fatal(err)
	}
	api := testenv.StartT(t, testenv.Options{APIServerArgs: []string{"--admission-control-config-file=" + config}})
	ctx := t.Context()
	cfg := rest.CopyConfig(api.Config())
	warned := &warnings{}
	cfg.WarningHandler = warned
	client := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))

	// The namespace and its ServiceAccount first, the DaemonSets last.
	objs := readUnstructured(t)
	for _, file := range []string{"serviceaccount.yaml", "rbac.yaml", "rbac-self-attach.yaml", "daemonset.yaml", "node-restricted/daemonset.yaml"} {
		if len(objs[file]) == 0 {
			t.Fatalf("deploy/%s: no object", file)
		}
		for _, o := range objs[file] {
			dryRun := o.GetKind() == "DaemonSet"
			if err := apply(ctx, dyn, mapper, o, dryRun); err != nil {
				t.Fatalf("deploy/%s: %v", file, err)
			}
			if w := warned.take(); len(w) > 0 {
				t.Errorf("deploy/%s: %s %s: warnings %q", file, o.GetKind(), o.GetName(), w)
			}
		}
		delete(objs, file)
	}
	if len(objs) > 0 {
		t.Errorf("deploy/ has manifests this test does not apply: %v", objs)
	}

	for _, ns := range []*v1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "cluster-default"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "baseline", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}},
	} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	typed := readManifests(t)
	for _, file := range []string{"daemonset.yaml", "node-restricted/daemonset.yaml"} {
		ds := typed[file][0].(*appsv1.DaemonSet)
		for _, tt := range []struct {
			namespace string
			admitted  bool
		}{
			{namespace: ds.Namespace, admitted: true},
			{namespace: "cluster-default"},
			{namespace: "baseline"},
		} {
			pod := &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-check", Namespace: tt.namespace, Labels: ds.Spec.Template.Labels},
				Spec:       *ds.Spec.Template.Spec.DeepCopy(),
			}
			pod.Spec.NodeName = "node-1"
			_, err := client.CoreV1().Pods(tt.namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case tt.admitted && err != nil:
				t.Errorf("deploy/%s: the pod is refused in namespace %s: %v", file, tt.namespace, err)
			case !tt.admitted && err == nil:
				t.Errorf("deploy/%s: the pod is admitted in namespace %s, which enforces baseline", file, tt.namespace)
			case !tt.admitted && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity")):
				t.Errorf("deploy/%s: in namespace %s: %v, want Pod Security admission's refusal", file, tt.namespace, err)
			}
		}
		warned.take()
	}
}

// apply applies o with server-side apply, as `kubectl apply --server-side`
// does, only validated and admitted when dryRun.
func apply(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured, dryRun bool) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "nodevol-deploy-test"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := r.Apply(ctx, o.GetName(), o, opts); err != nil {
		return err
	}
	return nil
}

// readUnstructured decodes every document of every YAML file under
// deployDir as unstructured objects, by file relative to deployDir.
func readUnstructured(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	out := map[string][]*unstructured.Unstructured{}
	forEachManifest(t, func(rel string, doc []byte) {
		o := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &o.Object); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if len(o.Object) > 0 {
			out[rel] = append(out[rel], o)
		}
	})
	return out
}
