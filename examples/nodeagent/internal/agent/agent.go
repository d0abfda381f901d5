package agent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volumemanager"
)

// runAgent runs nodevol against a real cluster: the pods bound to this node
// come from an informer, drivers from {root}/plugins_registry (as with the
// kubelet) and from --driver flags.
func runAgent(ctx context.Context, o options) error {
	cfg, err := restConfig(o)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	if err := checkKubeletRoot(ctx, o.rootDir); err != nil {
		return err
	}
	reg := newRegistry()
	events := record.NewBroadcaster(record.WithContext(ctx))
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	vm, err := volumemanager.New(managerConfig(o, client, reg, events.NewRecorder(scheme.Scheme, v1.EventSource{Component: "nodevol", Host: o.node})))
	if err != nil {
		return err
	}
	var podsSynced atomic.Bool
	if o.httpEndpoint != "" {
		stop, err := serveHTTP(ctx, o.httpEndpoint, reg, func(ctx context.Context) error {
			if !podsSynced.Load() {
				return fmt.Errorf("the informer of node %s's pods has not synced yet", o.node)
			}
			return vm.Healthy(ctx)
		})
		if err != nil {
			return err
		}
		defer stop()
	}
	if o.profilingAddress != "" {
		stop, err := serveProfiling(ctx, o.profilingAddress)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := updateNodeAttachMode(ctx, client, vm, o.node); err != nil {
		return err
	}
	for _, d := range o.drivers {
		name, endpoint, ok := strings.Cut(d, "=")
		if !ok {
			return fmt.Errorf("--driver %q: want name=/path/to/csi.sock", d)
		}
		if err := vm.Drivers().Register(ctx, name, endpoint); err != nil {
			return fmt.Errorf("registering driver %s: %w", name, err)
		}
	}
	if err := watchPods(ctx, vm, client, o, &podsSynced); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Node agent running", "node", o.node, "rootDir", o.rootDir)
	// SIGTERM ends ctx: the pod informer stops (no new work), Run lets the
	// operations in flight finish within --shutdown-grace-period and
	// returns when they have.
	err = vm.Run(ctx)
	klog.FromContext(ctx).Info("Node agent stopped", "node", o.node)
	return err
}

// watchPods feeds vm the pods bound to node o.node from an informer: added
// and updated pods (podChanged), deleted ones with their directories
// (podGone), and, once the informer has listed them all, MarkPodsSynced,
// synced set, and the directories of pods deleted while the agent was
// down (sweepOrphans).
func watchPods(ctx context.Context, vm *volumemanager.VolumeManager, client kubernetes.Interface, o options, synced *atomic.Bool) error {
	pods := nodePods(client, o.node)
	handler, err := pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { podChanged(ctx, vm, obj) },
		UpdateFunc: func(_, obj any) { podChanged(ctx, vm, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				// Its volumes go, then its directory under the root.
				go podGone(ctx, vm, pod, defaultPodDirRetry)
			}
		},
	})
	if err != nil {
		return err
	}
	pods.Start(ctx.Done())
	go func() {
		// Volumes an earlier run left on disk are torn down only once every
		// pod of the node has been added: they may be a running pod's.
		if cache.WaitForCacheSync(ctx.Done(), handler.HasSynced) {
			vm.MarkPodsSynced()
			synced.Store(true)
			_ = sweepOrphans(ctx, vm, o.rootDir, podKnown(pods.Core().V1().Pods().Informer().GetStore()), defaultPodDirRetry)
		}
	}()
	return nil
}

// podKnown reports whether store (the pod informer's) has a pod of that
// UID.
func podKnown(store cache.Store) func(types.UID) bool {
	return func(uid types.UID) bool {
		for _, obj := range store.List() {
			if pod, ok := obj.(*v1.Pod); ok && pod.UID == uid {
				return true
			}
		}
		return false
	}
}

// nodePods is the informer factory of the pods bound to node. Its pods
// are kept without managedFields (trimPod).
func nodePods(client kubernetes.Interface, node string) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}),
		informers.WithTransform(trimPod))
}

// trimPod drops a pod's managedFields before the informer keeps it: the
// record of which client set which field, often as large as the rest of
// the pod, that neither the agent nor nodevol reads (AddPod keeps a
// compact record of what it reads). It returns a shallow copy and writes
// nothing it was given; it is idempotent, as client-go's TransformFunc
// must be.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok || len(pod.ManagedFields) == 0 {
		return obj, nil
	}
	out := *pod
	out.ManagedFields = nil
	return &out, nil
}

// kubeletSocket is where a running kubelet serves its pod-resources API,
// under its root directory (the kubelet's getPodResourcesDir): it always
// does, so a socket there that accepts a connection is a live kubelet.
const kubeletSocket = "pod-resources/kubelet.sock"

// checkKubeletRoot refuses a root directory that a running kubelet uses:
// the two would register the same drivers, mount the same pods' volumes
// and tear down each other's as orphans (docs/OPERATIONS.md, "Never two
// volume managers on one node"). A socket left by a kubelet that has stopped refuses the
// connection and is no conflict: that is a hand-over.
func checkKubeletRoot(ctx context.Context, rootDir string) error {
	path := filepath.Join(rootDir, kubeletSocket)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil
	}
	_ = conn.Close()
	return fmt.Errorf("a kubelet is running on root directory %s (it answers on %s): "+
		"stop it, or give this agent a root directory of its own (--root-dir)", rootDir, path)
}

// podChanged adds a running pod; a pod whose containers are all done gives
// its volumes back, as the kubelet does once a pod has terminated.
func podChanged(ctx context.Context, vm *volumemanager.VolumeManager, obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		vm.DeletePod(pod)
		return
	}
	if err := vm.AddPod(pod); err != nil {
		// The informer lists this node's pods only: a pod refused here
		// moved to another node, and is the scheduler's problem.
		klog.FromContext(ctx).Error(err, "Pod refused", "pod", klog.KObj(pod))
	}
}

// restConfig is the API client's configuration: --kubeconfig, else the
// pod's in-cluster one, with the rate limit of --kube-api-qps and
// --kube-api-burst.
func restConfig(o options) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig); err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", o.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	return cfg, nil
}

// managerConfig is the volume manager's configuration the flags in o ask
// for.
func managerConfig(o options, client kubernetes.Interface, reg prometheus.Registerer, recorder record.EventRecorder) volumemanager.Config {
	return volumemanager.Config{NodeName: o.node, KubeClient: client, RootDir: o.rootDir, VolumePluginDir: o.volumePluginDir,
		PluginRegistration: o.registration, ReportVolumesInUse: o.reportInUse, ClusterInformers: o.clusterInformers,
		SelfAttach: o.selfAttach, Registerer: reg, ShutdownGracePeriod: o.shutdownGrace, EventRecorder: recorder}
}
