package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/testenv"
)

// requestCounter counts a client's requests by "VERB resource", the
// resource being the path element after the API group version (and
// namespace).
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 100, 200 // the kubelet's order; the default 5 would dominate the timings
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			c.mu.Lock()
			if c.n == nil {
				c.n = map[string]int{}
			}
			verb := r.Method
			if r.URL.Query().Get("watch") == "true" {
				verb = "WATCH"
			}
			c.n[verb+" "+resourceOf(r.URL.Path)]++
			c.mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

// get returns the count of key ("VERB resource").
func (c *requestCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// take returns the counts so far and starts again from zero.
func (c *requestCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.n
	c.n = nil
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf is the resource of an API path: /api/v1/namespaces/ns/pods/x
// -> pods, /apis/storage.k8s.io/v1/csinodes/n -> csinodes,
// /api/v1/nodes/n/status -> nodes/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return path
	case 1, 2:
		return parts[0]
	}
	return parts[0] + "/" + parts[2]
}

// nrCreateClaim creates, as the admin, a claim and the CSI volume bound to
// it (with a nodePublishSecretRef), as the control plane leaves them.
func nrCreateClaim(t *testing.T, admin kubernetes.Interface, ns, name, driver string) *v1.PersistentVolume {
	t.Helper()
	pvc, pv := csitest.BoundClaim(ns, name, csitest.PVSpec{
		Driver:            driver,
		Handle:            "handle-" + name,
		NodePublishSecret: &v1.SecretReference{Namespace: ns, Name: "publish"},
	})
	_, pv, err := csitest.CreateBound(t.Context(), admin, pvc, pv)
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// TestIntegrationNodeRestricted runs the volume manager with a node's own
// credentials (a client certificate for system:node:node-1 in
// system:nodes) against a real kube-apiserver with the Node authorizer and
// the NodeRestriction admission plugin, in the default mode: a driver
// registers (Node annotation, CSINode), pods mount and unmount, the
// volumes in use reach the Node's status, and a pod of another node
// cannot make nodevol read its claims. It reports the API requests per
// mounted volume.
func TestIntegrationNodeRestricted(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{
		AuthorizationModes:     []string{"Node", "RBAC"},
		EnableAdmissionPlugins: []string{"NodeRestriction"},
	})
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Config())
	nodeCfg, err := env.CertConfig(testenv.User{Name: "system:node:" + node, Groups: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	var counter requestCounter
	nodeClient := kubernetes.NewForConfigOrDie(counter.wrap(nodeCfg))

	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	const ns = "apps"
	for _, obj := range []func() error{
		func() error {
			_, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			d := csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{})
			d.UID = ""
			_, err := admin.StorageV1().CSIDrivers().Create(ctx, d, metav1.CreateOptions{})
			return err
		},
		func() error {
			s := csitest.Secret(ns, "publish", map[string]string{"key": "s3cret"})
			s.UID = ""
			_, err := admin.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
			return err
		},
		func() error { // a kubelet registers its own Node; nodevol does not
			n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
			// A volume an earlier run reported: the first report replaces it.
			n.Status.VolumesInUse = []v1.UniqueVolumeName{"kubernetes.io/csi/gone^handle"}
			_, err := nodeClient.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
			return err
		},
	} {
		if err := obj(); err != nil {
			t.Fatal(err)
		}
	}

	root := csitest.SocketDir(t) // the registrar's socket goes in root/plugins_registry
	vm, err := New(Config{
		NodeName: node, KubeClient: nodeClient, RootDir: root, Mounter: mount.NewFakeMounter(nil),
		PluginRegistration: true, ReportVolumesInUse: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	vm.MarkPodsSynced()

	// Registration through the plugin directory, with the node's rights.
	regDir := filepath.Join(root, "plugins_registry")
	eventually(t, "registration directory created", func() bool { _, err := os.Stat(regDir); return err == nil })
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: regDir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	if s, err := reg.WaitForStatus(ctx, 1); err != nil || !s.Registered {
		t.Fatalf("registration status %+v, %v; want registered", s, err)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || !strings.Contains(n.Annotations[registration.NodeIDAnnotation], drv.DriverName()) {
		t.Fatalf("Node %s annotation %q (%v), want the driver's node ID", node, n.Annotations[registration.NodeIDAnnotation], err)
	}
	csiNode, err := admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || len(csiNode.Spec.Drivers) != 1 || csiNode.Spec.Drivers[0].Name != drv.DriverName() {
		t.Fatalf("CSINode %s: %+v, %v; want the driver", node, csiNode, err)
	}

	// Pods of this node mount: one GET of each claim, volume and secret.
	const pods = 5
	list, reqs := nrMountPods(t, admin, vm, &counter, drv.DriverName(), ns, pods)
	for _, r := range []string{"persistentvolumeclaims", "persistentvolumes"} {
		if got := reqs["GET "+r]; got < pods {
			t.Errorf("%d GETs of %s for %d volumes, want at least one each", got, r, pods)
		}
	}
	for k := range reqs {
		if strings.HasPrefix(k, "WATCH ") && !strings.HasSuffix(k, "csidrivers") || k == "GET persistentvolumeclaims" && reqs[k] > 2*pods {
			t.Errorf("%s: %d requests", k, reqs[k])
		}
	}
	for _, r := range drv.Requests() {
		if r.Method == "NodePublishVolume" {
			if s := r.Req.(interface{ GetSecrets() map[string]string }).GetSecrets(); s["key"] != "s3cret" {
				t.Errorf("NodePublishVolume secrets %v, want the PV's nodePublishSecretRef", s)
			}
		}
	}

	// The Node's status says which volumes are in use: through the node's
	// own credentials, the stale entry is replaced by none, for the
	// driver needs no attach (the kubelet lists only attachable volumes).
	eventually(t, "volumesInUse reported", func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && len(n.Status.VolumesInUse) == 0
	})

	// A pod of another node: refused before anything is read (the node
	// may not read its claim anyway).
	nrCreateClaim(t, admin, ns, "foreign", drv.DriverName())
	foreign := csitest.Pod(ns, "foreign", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "foreign"}}})
	foreign.UID, foreign.Spec.NodeName = "", "node-2"
	if foreign, err = admin.CoreV1().Pods(ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantForeign := `volumemanager: pod apps/foreign is bound to node "node-2", not to this node "node-1": its volumes are not mounted here`
	if err := vm.AddPod(foreign); err == nil || err.Error() != wantForeign {
		t.Fatalf("AddPod of a pod of node-2: %v, want %s", err, wantForeign)
	}
	if err := vm.WaitForAttachAndMount(ctx, foreign); !errors.Is(err, ErrFinal) || !strings.HasSuffix(err.Error(), wantForeign) {
		t.Fatalf("WaitForAttachAndMount of a pod of node-2: %v, want final, ending with %s", err, wantForeign)
	}
	if _, err := nodeClient.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "foreign", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the node's own GET of another node's claim: %v, want Forbidden", err)
	}

	// Unmount: pods deleted, every volume unpublished and unstaged.
	for _, p := range list {
		vm.DeletePod(p)
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := vm.WaitForUnmount(wctx, p)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := drv.PublishedVolumes(); len(got) != 0 {
		t.Errorf("still published: %v", got)
	}
	// Unstaged after the last pod's unmount, which WaitForUnmount does not wait for.
	waitUnstaged(t, vm)
	if got := drv.StagedVolumes(); len(got) != 0 {
		t.Errorf("still staged after WaitForUnstaged: %v", got)
	}
	eventually(t, "volumesInUse emptied", func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && len(n.Status.VolumesInUse) == 0
	})
}

// nrMountPods creates n pods of this node with a claim each, adds them to
// vm, waits until all are mounted and returns them with the requests
// counter saw meanwhile (logged per volume).
func nrMountPods(t *testing.T, admin kubernetes.Interface, vm *VolumeManager, counter *requestCounter, driver, ns string, n int) ([]*v1.Pod, map[string]int) {
	t.Helper()
	ctx := t.Context()
	var list []*v1.Pod
	for i := range n {
		claim := fmt.Sprintf("data-%d", i)
		nrCreateClaim(t, admin, ns, claim, driver)
		pod := csitest.Pod(ns, "p-"+claim, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
		pod.UID, pod.Spec.NodeName = "", node
		created, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, created)
	}
	counter.take()
	start := time.Now()
	for _, p := range list {
		vm.AddPod(p)
	}
	for _, p := range list {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := vm.WaitForAttachAndMount(wctx, p)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	mountTime := time.Since(start)
	reqs := counter.take()
	perVolume := map[string]float64{}
	total := 0
	for k, v := range reqs {
		perVolume[k] = float64(v) / float64(n)
		total += v
	}
	t.Logf("mounted %d volumes in %v; API requests per mounted volume: %.1f in all, %v", n, mountTime.Round(time.Millisecond), float64(total)/float64(n), perVolume)
	return list, reqs
}

// TestIntegrationInformerModeRequests: with Config.ClusterInformers
// (cluster-wide credentials), mounting costs no request for claims and
// volumes; the count is logged for docs/PERFORMANCE.md beside the default
// mode's (the node's own credentials, TestIntegrationNodeRestricted).
func TestIntegrationInformerModeRequests(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Config())
	var counter requestCounter
	client := kubernetes.NewForConfigOrDie(counter.wrap(env.Config()))
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	const ns = "apps"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{})
	d.UID = ""
	if _, err := admin.StorageV1().CSIDrivers().Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := csitest.Secret(ns, "publish", map[string]string{"key": "s3cret"})
	s.UID = ""
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ClusterInformers: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	_, reqs := nrMountPods(t, admin, vm, &counter, drv.DriverName(), ns, 5)
	for _, r := range []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"} {
		if got := reqs["GET "+r]; got != 0 {
			t.Errorf("%d GETs of %s with informers, want 0", got, r)
		}
	}
}

// TestIntegrationRegistrationRejected: a driver whose topology key the API
// server refuses as a Node label is not registered; the registrar hears
// an error naming the node, the field and the value, and the attempts
// back off.
func TestIntegrationRegistrationRejected(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Config())
	var counter requestCounter
	client := kubernetes.NewForConfigOrDie(counter.wrap(env.Config()))
	if _, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, Topology: map[string]string{"topology.example.com/bad key!": "a"}})
	root := csitest.SocketDir(t) // the registrar's socket goes in root/plugins_registry
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), PluginRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	regDir := filepath.Join(root, "plugins_registry")
	eventually(t, "registration directory created", func() bool { _, err := os.Stat(regDir); return err == nil })
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: regDir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	s, err := reg.WaitForStatus(ctx, 1)
	if err != nil || s.Registered {
		t.Fatalf("registration status %+v, %v; want refused", s, err)
	}
	for _, want := range []string{"node " + node, "metadata.labels", "bad key!"} {
		if !strings.Contains(s.Error, want) {
			t.Errorf("registration error %q does not say %q", s.Error, want)
		}
	}
	if _, err := vm.Drivers().Client(drv.DriverName()); err == nil {
		t.Error("the refused driver is registered")
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || n.Annotations[registration.NodeIDAnnotation] != "" {
		t.Errorf("Node annotation %q (%v), want none", n.Annotations[registration.NodeIDAnnotation], err)
	}
	// Retried, but backing off (500 ms, then 1 s, ...): the third attempt
	// comes no sooner than 1.5 s after the first, never in a hot loop.
	first := time.Now()
	eventually(t, "a third registration attempt", func() bool { return drv.Calls("NodeGetInfo") >= 3 })
	if d := time.Since(first); d < time.Second {
		t.Errorf("three attempts within %v: want backoff", d)
	}
	updates := 0
	for k, v := range counter.take() {
		if strings.HasPrefix(k, "PUT nodes") || strings.HasPrefix(k, "PATCH nodes") {
			updates += v
		}
	}
	if calls := drv.Calls("NodeGetInfo"); updates > calls {
		t.Errorf("%d Node updates for %d attempts: want at most one each", updates, calls)
	}
}
