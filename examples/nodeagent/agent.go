package main

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volumemanager"
)

// runAgent runs nodevol against a real cluster: the pods bound to this node
// come from an informer, drivers from {root}/plugins_registry (as with the
// kubelet) and from --driver flags.
func runAgent(ctx context.Context, o options) error {
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: o.node, KubeClient: client, RootDir: o.rootDir,
		PluginRegistration: o.registration, ReportVolumesInUse: o.reportInUse, NodeRestricted: o.nodeRestricted,
		SelfAttach: o.selfAttach})
	if err != nil {
		return err
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
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.node).String()
		}))
	handler, err := pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { podChanged(vm, obj) },
		UpdateFunc: func(_, obj any) { podChanged(vm, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				vm.DeletePod(pod)
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
		}
	}()
	klog.FromContext(ctx).Info("Node agent running", "node", o.node, "rootDir", o.rootDir)
	return vm.Run(ctx)
}

// podChanged adds a running pod; a pod whose containers are all done gives
// its volumes back, as the kubelet does once a pod has terminated.
func podChanged(vm *volumemanager.VolumeManager, obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		vm.DeletePod(pod)
		return
	}
	vm.AddPod(pod)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
