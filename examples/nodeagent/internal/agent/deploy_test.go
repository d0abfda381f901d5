package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// deployDir holds the manifests the agent is deployed with.
const deployDir = "../../../../deploy"

// readManifests decodes every document of every YAML file under deployDir
// with client-go's scheme, as kubectl would send them (and again strictly:
// a misspelt field is an error), by file relative to deployDir.
func readManifests(t *testing.T) map[string][]runtime.Object {
	t.Helper()
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	out := map[string][]runtime.Object{}
	forEachManifest(t, func(rel string, doc []byte) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if _, _, err := strict.Decode(doc, nil, nil); err != nil {
			t.Errorf("%s: strict decoding: %v", rel, err)
		}
		out[rel] = append(out[rel], obj)
	})
	return out
}

// forEachManifest calls fn with every non-empty YAML document of every
// file under deployDir, and the file's path relative to deployDir.
func forEachManifest(t *testing.T, fn func(rel string, doc []byte)) {
	t.Helper()
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(deployDir, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := reader.Read()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if len(bytes.TrimSpace(doc)) > 0 {
				fn(rel, doc)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeployManifests: every manifest of deploy/ is the Kubernetes types it
// claims to be, and the DaemonSets run the agent as docs/OPERATIONS.md
// says: privileged, the root directory a Bidirectional hostPath mount that
// --root-dir names, NODE_NAME from the downward API, a liveness probe on
// /healthz at --http-endpoint's port, a termination grace period longer
// than --shutdown-grace-period, and flags the agent knows. The default
// variant runs as the ServiceAccount that rbac.yaml binds; the
// node-restricted one with the node's kubeconfig and no token. Neither
// asks for informers of every claim, volume and attachment
// (--cluster-informers): rbac.yaml grants only get on them, and the Node
// authorizer no more.
func TestDeployManifests(t *testing.T) {
	manifests := readManifests(t)
	kinds := map[string][]string{}
	for file, objs := range manifests {
		for _, o := range objs {
			kinds[file] = append(kinds[file], o.GetObjectKind().GroupVersionKind().Kind)
		}
	}
	want := map[string][]string{
		"rbac.yaml":                      {"ClusterRole", "ClusterRoleBinding"},
		"rbac-self-attach.yaml":          {"ClusterRole", "ClusterRoleBinding"},
		"serviceaccount.yaml":            {"Namespace", "ServiceAccount"},
		"daemonset.yaml":                 {"DaemonSet"},
		"node-restricted/daemonset.yaml": {"DaemonSet"},
	}
	if len(kinds) != len(want) {
		t.Errorf("deploy/ has %v, want %v", kinds, want)
	}
	for file, k := range want {
		if !slices.Equal(kinds[file], k) {
			t.Errorf("deploy/%s: %v, want %v", file, kinds[file], k)
		}
	}
	if t.Failed() {
		return
	}
	sa := manifests["serviceaccount.yaml"][1].(*v1.ServiceAccount)
	binding := manifests["rbac.yaml"][1].(*rbacv1.ClusterRoleBinding)
	role := manifests["rbac.yaml"][0].(*rbacv1.ClusterRole)
	if binding.RoleRef.Name != role.Name || !slices.ContainsFunc(binding.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa.Name && s.Namespace == sa.Namespace
	}) {
		t.Errorf("rbac.yaml: the binding %+v does not bind ClusterRole %s to ServiceAccount %s/%s", binding, role.Name, sa.Namespace, sa.Name)
	}
	// The self-attach role binds the same subjects, and only adds writing
	// VolumeAttachments and listing them (once, at start).
	selfBinding := manifests["rbac-self-attach.yaml"][1].(*rbacv1.ClusterRoleBinding)
	selfRole := manifests["rbac-self-attach.yaml"][0].(*rbacv1.ClusterRole)
	if selfBinding.RoleRef.Name != selfRole.Name || !slices.Equal(selfBinding.Subjects, binding.Subjects) {
		t.Errorf("rbac-self-attach.yaml: the binding %+v does not bind ClusterRole %s to rbac.yaml's subjects %+v", selfBinding, selfRole.Name, binding.Subjects)
	}
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments"}, Verbs: []string{"create", "delete", "list"}}}
	if !reflect.DeepEqual(selfRole.Rules, wantRules) {
		t.Errorf("rbac-self-attach.yaml: rules %+v, want %+v", selfRole.Rules, wantRules)
	}

	for _, tt := range []struct {
		file           string
		nodeRestricted bool
	}{
		{file: "daemonset.yaml"},
		{file: "node-restricted/daemonset.yaml", nodeRestricted: true},
	} {
		t.Run(tt.file, func(t *testing.T) {
			ds := manifests[tt.file][0].(*appsv1.DaemonSet)
			spec := ds.Spec.Template.Spec
			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(spec.Containers))
			}
			c := spec.Containers[0]
			var o options
			if err := newFlagSet(&o).Parse(c.Args); err != nil {
				t.Fatalf("args %q: %v", c.Args, err)
			}
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Error("the container is not privileged")
			}
			hostPaths := map[string]string{}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			mounts := map[string]v1.VolumeMount{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m
			}
			root, ok := mounts[o.rootDir]
			switch {
			case !ok:
				t.Errorf("--root-dir %s is not mounted", o.rootDir)
			case root.MountPropagation == nil || *root.MountPropagation != v1.MountPropagationBidirectional:
				got := "none"
				if root.MountPropagation != nil {
					got = string(*root.MountPropagation)
				}
				t.Errorf("--root-dir %s: mount propagation %s, want Bidirectional", o.rootDir, got)
			case hostPaths[root.Name] != o.rootDir:
				t.Errorf("--root-dir %s: host path %q, want the same path on the host", o.rootDir, hostPaths[root.Name])
			}
			for path, m := range mounts {
				if path != o.rootDir && strings.HasPrefix(path, o.rootDir+"/") {
					t.Errorf("%s is mounted inside the Bidirectional root directory (%s): it would propagate to the host", path, m.Name)
				}
			}
			if !o.registration {
				t.Error("--plugin-registration is off: drivers have no way to register")
			}
			if dev, ok := mounts["/dev"]; !ok || hostPaths[dev.Name] != "/dev" {
				t.Error("/dev of the host is not mounted (block volumes, loop devices)")
			}
			if !slices.ContainsFunc(c.Env, func(e v1.EnvVar) bool {
				return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			}) {
				t.Errorf("no NODE_NAME from the downward API's spec.nodeName in %+v", c.Env)
			}
			if o.node != "" {
				t.Errorf("--node %s: the node comes from NODE_NAME", o.node)
			}
			_, port, err := net.SplitHostPort(o.httpEndpoint)
			if err != nil {
				t.Fatalf("--http-endpoint %q: %v", o.httpEndpoint, err)
			}
			for name, p := range map[string]*v1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
					t.Errorf("%s probe %+v: want an HTTP GET of /healthz", name, p)
					continue
				}
				probed := p.HTTPGet.Port.String() // a port's name, or its number
				if i := slices.IndexFunc(c.Ports, func(cp v1.ContainerPort) bool { return cp.Name == probed }); i >= 0 {
					probed = strconv.Itoa(int(c.Ports[i].ContainerPort))
				}
				if probed != port {
					t.Errorf("%s probe port %s is not --http-endpoint's port %s", name, p.HTTPGet.Port.String(), port)
				}
			}
			if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= o.shutdownGrace {
				t.Errorf("terminationGracePeriodSeconds %v is not longer than --shutdown-grace-period %v", g, o.shutdownGrace)
			}
			if o.reportInUse {
				t.Error("--report-volumes-in-use is on: the kubelet of the node that runs the DaemonSet writes status.volumesInUse too")
			}
			if ds.Namespace != sa.Namespace {
				t.Errorf("namespace %s, want %s (serviceaccount.yaml)", ds.Namespace, sa.Namespace)
			}

			if o.clusterInformers {
				t.Error("--cluster-informers is on")
			}
			if !tt.nodeRestricted {
				if spec.ServiceAccountName != sa.Name || o.kubeconfig != "" {
					t.Errorf("serviceAccountName %q, --kubeconfig %q: want %s, in-cluster config",
						spec.ServiceAccountName, o.kubeconfig, sa.Name)
				}
				return
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.ServiceAccountName != "" {
				t.Errorf("automountServiceAccountToken %v, serviceAccountName %q: want false and none (the node's credentials)",
					spec.AutomountServiceAccountToken, spec.ServiceAccountName)
			}
			kc, ok := mounts[o.kubeconfig]
			if !ok || hostPaths[kc.Name] != o.kubeconfig || !kc.ReadOnly {
				t.Errorf("--kubeconfig %s is not the host's file mounted read-only", o.kubeconfig)
			}
			if pki, ok := mounts["/var/lib/kubelet/pki"]; !ok || !pki.ReadOnly {
				t.Error("the kubelet's client certificates (/var/lib/kubelet/pki) are not mounted read-only")
			}
		})
	}
}

// measuredPeakRSS is the highest peak RSS docs/PERFORMANCE.md measured
// for nodevol on a node-sized load (1,000 pods' volumes mounted: 84-100
// MiB): the DaemonSets' memory request must not be below it.
var measuredPeakRSS = resource.MustParse("100Mi")

// TestDeployPodSettings: the namespace admits privileged pods under Pod
// Security admission; each DaemonSet's pod asks for the memory nodevol was
// measured to use, with a limit above the request, runs on Linux nodes
// only, and sets the API client's rate limit explicitly.
func TestDeployPodSettings(t *testing.T) {
	manifests := readManifests(t)
	ns := manifests["serviceaccount.yaml"][0].(*v1.Namespace)
	for _, mode := range []string{"enforce", "warn", "audit"} {
		if got := ns.Labels["pod-security.kubernetes.io/"+mode]; got != "privileged" {
			t.Errorf("namespace %s: label pod-security.kubernetes.io/%s = %q, want privileged", ns.Name, mode, got)
		}
	}
	for _, file := range []string{"daemonset.yaml", "node-restricted/daemonset.yaml"} {
		ds := manifests[file][0].(*appsv1.DaemonSet)
		spec := ds.Spec.Template.Spec
		c := spec.Containers[0]
		req, lim := c.Resources.Requests[v1.ResourceMemory], c.Resources.Limits[v1.ResourceMemory]
		if req.Cmp(measuredPeakRSS) < 0 {
			t.Errorf("deploy/%s: memory request %s, below the measured %s", file, req.String(), measuredPeakRSS.String())
		}
		if lim.Cmp(req) <= 0 {
			t.Errorf("deploy/%s: memory limit %s, want one above the request %s", file, lim.String(), req.String())
		}
		if spec.NodeSelector[v1.LabelOSStable] != "linux" {
			t.Errorf("deploy/%s: nodeSelector %v has no %s=linux", file, spec.NodeSelector, v1.LabelOSStable)
		}
		for _, flag := range []string{"--kube-api-qps=", "--kube-api-burst="} {
			if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, flag) }) {
				t.Errorf("deploy/%s: no %s in %q", file, flag, c.Args)
			}
		}
	}
}
