package kubeletbench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/kubernetes/pkg/volume/util/volumepathhandler"
	"k8s.io/mount-utils"
)

// kubeletVM is the kubelet's volume manager with its CSI plugin, real
// mounts and real host utilities, running on the env's root.
type kubeletVM struct {
	vm     volumemanager.VolumeManager
	pods   *podManager
	cancel context.CancelFunc
	// client is its API server, host its volume host.
	client *fake.Clientset
	host   *realHost
	// log holds what it logged as an error.
	log *errLog
}

// startKubelet starts the kubelet's volume manager with the pods wanted
// in its pod manager (the kubelet's pod sources synced): it reconstructs
// what it finds on disk and tears down what no pod wants.
func (e *hvEnv) startKubelet(wanted []*hvPod) *kubeletVM {
	e.t.Helper()
	// The kubelet makes its pods directory when it starts, before the
	// volume manager looks into it.
	if err := os.MkdirAll(filepath.Join(e.root, "pods"), 0o750); err != nil {
		e.t.Fatal(err)
	}
	o := e.objects(wanted)
	client := fake.NewSimpleClientset(o.apiObjects()...)
	client.PrependReactor("create", "serviceaccounts", e.tokens.react)
	log := &errLog{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), log.logger()))
	mounter := mount.New("")
	host, err := newVolumeHost(ctx, e.t, hostConfig{root: e.root, client: client, node: &o.node,
		mounter: mounter, hostUtil: hostutil.NewHostUtil(), subpather: subpath.New(mounter)})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	for _, d := range e.drivers {
		if err := csi.PluginHandler.RegisterPlugin(ctx, d.name, d.sock, []string{"1.0.0"}, nil); err != nil {
			cancel()
			e.t.Fatal(err)
		}
	}
	pm := &podManager{pods: map[types.UID]*v1.Pod{}}
	for _, p := range wanted {
		pm.set(p.pod, true)
	}
	vm := volumemanager.NewVolumeManager(true, hvNode, pm, podState{pm}, client, host.pluginMgr,
		host.mounter, host.hostUtil, filepath.Join(e.root, "pods"), &record.FakeRecorder{},
		volumepathhandler.NewBlockVolumePathHandler(), volumeHealth{}, volumeHealthPeriod)
	go vm.Run(ctx, sourcesReady{})
	// The node status loop's part: report the volumes in use, which the
	// kubelet requires before it mounts an attachable volume.
	go func() {
		for ctx.Err() == nil {
			vm.MarkVolumesAsReportedInUse(vm.GetVolumesInUse())
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	k := &kubeletVM{vm: vm, pods: pm, cancel: cancel, client: client, host: host, log: log}
	e.kubelet = k
	return k
}

// stopKubelet stops the kubelet's volume manager without tearing anything
// down, as when the kubelet process stops, and forgets the drivers'
// registrations, which a new kubelet process would not have (the CSI
// plugin keeps them in a global store).
func (e *hvEnv) stopKubelet() {
	if e.kubelet != nil {
		e.kubelet.cancel()
		e.kubelet = nil
		for _, d := range e.drivers {
			csi.PluginHandler.DeRegisterPlugin(context.Background(), d.name, d.sock)
		}
	}
}

// mountPods adds the pods to the kubelet and waits for their volumes.
func (k *kubeletVM) mountPods(t *testing.T, pods ...*hvPod) {
	t.Helper()
	for _, p := range pods {
		k.pods.set(p.pod, true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range pods {
		if err := k.vm.WaitForAttachAndMount(ctx, p.pod); err != nil {
			t.Fatalf("the kubelet: pod %s: %v", p.name, err)
		}
	}
}

// deletePods removes the pods from the kubelet and waits for their
// volumes to be unmounted.
func (k *kubeletVM) deletePods(t *testing.T, pods ...*hvPod) {
	t.Helper()
	for _, p := range pods {
		k.pods.set(p.pod, false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range pods {
		if err := k.vm.WaitForUnmount(ctx, p.pod); err != nil {
			t.Fatalf("the kubelet: pod %s: %v", p.name, err)
		}
	}
}

// waitUnstaged waits until the kubelet has no volume in use any more:
// every pod's volume unmounted, every attachable volume's device
// unstaged. (The kubelet forgets a volume that is not attachable with its
// last pod, before it has unstaged it: checkNothingLeft waits for that.)
func (k *kubeletVM) waitUnstaged(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for len(k.vm.GetVolumesInUse()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the kubelet: volumes still in use: %v", k.vm.GetVolumesInUse())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
