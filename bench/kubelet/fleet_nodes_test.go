package kubeletbench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/internal/kubelettest"
)

// fleetNode is one node of BenchmarkFleet: its kubelet process.
type fleetNode struct {
	name string
	proc *kubelettest.Process
	// config is the kubelet's configuration file (its server's port).
	config string
}

// fleetNodeName is node i's name.
func fleetNodeName(i int) string { return fmt.Sprintf("fleet-%03d", i) }

// startFleetNodes starts n kubelets of spec's binary, each its own node
// with its own scratch directory, client certificate and fake runtime
// (or spec's real one), and waits until every Node is Ready. maxPods leaves room for the pods.
func startFleetNodes(b *testing.B, c *objCluster, spec fleetSpec) []fleetNode {
	b.Helper()
	maxPods := strconv.Itoa(max(110, spec.pods+10))
	args := []string{"--v", "1", "--max-pods", maxPods}
	if *fleetProfile > 0 {
		// Its /debug/pprof/profile to the benchmark, which has no client
		// certificate (the kubelet authorizes every request: AlwaysAllow).
		args = append(args, "--anonymous-auth=true")
	}
	nodes := make([]fleetNode, spec.nodes)
	kubelets := make([]*kubelettest.Kubelet, spec.nodes)
	for i := range nodes {
		name := fleetNodeName(i)
		cfg, err := c.env.NodeConfig(name)
		if err != nil {
			b.Fatal(err)
		}
		k, err := kubelettest.New(b, kubelettest.Options{Bin: spec.bin, Dir: filepath.Join(c.scratch, "nodes", name), Env: c.env,
			Node: name, NodeConfig: cfg, Args: args, RuntimeEndpoint: spec.endpoint})
		if err != nil {
			b.Fatal(err)
		}
		kubelets[i] = k
		nodes[i] = fleetNode{name: name, proc: k.Start(b, "kubelet"), config: k.ConfigFile}
	}
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	for i, k := range kubelets {
		if err := k.WaitNodeReady(ctx, nodes[i].proc, c.admin); err != nil {
			b.Fatal(err)
		}
	}
	return nodes
}

// createFleetObjects creates each pod's own configMap and secret, for
// pods pods on each of nodes nodes (a pod's objects are kept when it is
// created again under churn).
func createFleetObjects(ctx context.Context, c *objCluster, nodes, pods int) error {
	for n := range nodes {
		for i := range pods {
			name := fleetObjName(fleetNodeName(n), i)
			cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{objCMKey: objCMValue}}
			if _, err := c.admin.CoreV1().ConfigMaps(objNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating configMap %s: %w", name, err)
			}
			s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{objSecKey: "s3cret"}}
			if _, err := c.admin.CoreV1().Secrets(objNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating secret %s: %w", name, err)
			}
		}
	}
	return nil
}

// fleetObjName names the configMap and the secret of pod i of node.
func fleetObjName(node string, i int) string { return fmt.Sprintf("%s-obj-%03d", node, i) }

// fleetPod is pod i of node in generation gen (0 at start, 1 once created
// again): objPod's volumes with the pod's own configMap and secret, and a
// downwardAPI volume.
func fleetPod(node string, i, gen int) *v1.Pod {
	pod := objPod(i)
	pod.Name = fmt.Sprintf("%s-pod-%03d-%d", node, i, gen)
	pod.Spec.NodeName = node
	obj := fleetObjName(node, i)
	for j := range pod.Spec.Volumes {
		vs := &pod.Spec.Volumes[j].VolumeSource
		switch {
		case vs.ConfigMap != nil:
			vs.ConfigMap.Name = obj
		case vs.Secret != nil:
			vs.Secret.SecretName = obj
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "podinfo", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
		Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
	}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "podinfo", MountPath: "/etc/podinfo"})
	return pod
}

// podTracker records, from an informer on the pods' namespace (the
// benchmark's own client), when each pod was asked for (created or
// deleted) and when it was first seen Running and seen gone.
type podTracker struct {
	mu      sync.Mutex
	created map[string]time.Time
	running map[string]time.Time
	deleted map[string]time.Time
	gone    map[string]time.Time
	// changed is closed, and replaced, at each time recorded: wait's
	// wake-up.
	changed chan struct{}
}

// startPodTracker starts the informer until the benchmark ends.
func startPodTracker(b *testing.B, c *objCluster) *podTracker {
	b.Helper()
	t := &podTracker{created: map[string]time.Time{}, running: map[string]time.Time{},
		deleted: map[string]time.Time{}, gone: map[string]time.Time{}, changed: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(c.admin, 0, informers.WithNamespace(objNS))
	inf := f.Core().V1().Pods().Informer()
	seen := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok && p.Status.Phase == v1.PodRunning {
			t.mark(t.running, p.Name)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				t.mark(t.gone, p.Name)
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(b.Context().Done(), inf.HasSynced) {
		b.Fatal("the pod informer did not sync")
	}
	return t
}

// mark records now for name in m, unless it has a time there already.
func (t *podTracker) mark(m map[string]time.Time, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := m[name]; !ok {
		m[name] = time.Now()
		close(t.changed)
		t.changed = make(chan struct{})
	}
}

// create creates pods, each node's in a goroutine of its own (one after
// the other within a node), recording when each was asked for.
func (t *podTracker) create(ctx context.Context, c *objCluster, pods [][]*v1.Pod) error {
	return eachNode(pods, func(p *v1.Pod) error {
		t.mark(t.created, p.Name)
		if _, err := c.admin.CoreV1().Pods(objNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s: %w", p.Name, err)
		}
		return nil
	})
}

// remove deletes pods (gracefully, as a user does) as create creates them.
func (t *podTracker) remove(ctx context.Context, c *objCluster, pods [][]*v1.Pod) error {
	return eachNode(pods, func(p *v1.Pod) error {
		t.mark(t.deleted, p.Name)
		if err := c.admin.CoreV1().Pods(objNS).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting pod %s: %w", p.Name, err)
		}
		return nil
	})
}

// eachNode calls f on each node's pods, one goroutine per node; the first
// error is returned once every goroutine is done.
func eachNode(pods [][]*v1.Pod, f func(*v1.Pod) error) error {
	errs := make(chan error, len(pods))
	for _, ps := range pods {
		go func() {
			for _, p := range ps {
				if err := f(p); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range pods {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// wait waits until every pod of pods has a time in m, or timeout; it
// returns the pods still without one.
func (t *podTracker) wait(m map[string]time.Time, pods [][]*v1.Pod, timeout time.Duration) []string {
	expired := time.After(timeout)
	for {
		var missing []string
		t.mu.Lock()
		for _, ps := range pods {
			for _, p := range ps {
				if _, ok := m[p.Name]; !ok {
					missing = append(missing, p.Name)
				}
			}
		}
		changed := t.changed
		t.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-expired:
			return missing
		}
	}
}

// latencies are, for each pod of pods, the time from its from-mark to its
// to-mark (pods without both are left out).
func (t *podTracker) latencies(from, to map[string]time.Time, pods [][]*v1.Pod) []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Duration
	for _, ps := range pods {
		for _, p := range ps {
			a, okA := from[p.Name]
			z, okZ := to[p.Name]
			if okA && okZ {
				out = append(out, z.Sub(a))
			}
		}
	}
	return out
}
