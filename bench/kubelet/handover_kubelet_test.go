package kubeletbench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/token"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/configmap"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/downwardapi"
	"k8s.io/kubernetes/pkg/volume/emptydir"
	"k8s.io/kubernetes/pkg/volume/hostpath"
	"k8s.io/kubernetes/pkg/volume/local"
	"k8s.io/kubernetes/pkg/volume/projected"
	"k8s.io/kubernetes/pkg/volume/secret"
	volumetest "k8s.io/kubernetes/pkg/volume/testing"
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

// fakeKubeletHost is what the volume test kit's kubelet volume host
// implements; realHost replaces its mounter and host utilities.
type fakeKubeletHost interface {
	volume.VolumeHost
	volume.KubeletVolumeHost
}

// realHost is the kubelet's volume host with the real mounter, host
// utilities and subpather (the test kit's host has fakes, in fields that
// cannot be set), the kubelet's service account token manager, and a
// plugin manager initialised with this host, so that the plugins see them
// and wrap each other through it (a secret's tmpfs is an emptyDir). The
// secret and configMap getters are the test kit's: GETs on the client, as
// the kubelet's Get strategy makes them.
type realHost struct {
	fakeKubeletHost
	pluginMgr *volume.VolumePluginMgr
	mounter   mount.Interface
	hostUtil  hostutil.HostUtils
	subpather subpath.Interface
	tokens    *token.Manager
	node      *v1.Node
}

// kubeletPlugins are the kubelet's volume plugins of the kinds nodevol
// handles, as the kubelet probes them (cmd/kubelet/app/plugins.go).
func kubeletPlugins() []volume.VolumePlugin {
	var all []volume.VolumePlugin
	all = append(all, emptydir.ProbeVolumePlugins()...)
	all = append(all, hostpath.ProbeVolumePlugins(volume.VolumeConfig{})...)
	all = append(all, secret.ProbeVolumePlugins()...)
	all = append(all, configmap.ProbeVolumePlugins()...)
	all = append(all, downwardapi.ProbeVolumePlugins()...)
	all = append(all, projected.ProbeVolumePlugins()...)
	all = append(all, local.ProbeVolumePlugins()...)
	return append(all, csi.ProbeVolumePlugins()...)
}

func (h *realHost) GetSubpather() subpath.Interface { return h.subpather }

// GetNodeAllocatable is the node's allocatable resources, as the kubelet's
// host reads them (an emptyDir in memory is sized by them).
func (h *realHost) GetNodeAllocatable() (v1.ResourceList, error) {
	return h.node.Status.Allocatable, nil
}

func (h *realHost) GetServiceAccountTokenFunc() func(string, string, *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return h.tokens.GetServiceAccountToken
}

func (h *realHost) DeleteServiceAccountTokenFunc() func(types.UID) {
	return h.tokens.DeleteServiceAccountToken
}

// NewWrapperMounter is the kubelet's: the wrapped volume named
// wrapped_{name}, its plugin found in this host's plugin manager.
func (h *realHost) NewWrapperMounter(volName string, spec volume.Spec, pod *v1.Pod) (volume.Mounter, error) {
	if spec.Volume != nil {
		spec.Volume.Name = "wrapped_" + volName
	}
	plugin, err := h.pluginMgr.FindPluginBySpec(&spec)
	if err != nil {
		return nil, err
	}
	return plugin.NewMounter(&spec, pod)
}

// NewWrapperUnmounter is NewWrapperMounter's counterpart.
func (h *realHost) NewWrapperUnmounter(volName string, spec volume.Spec, podUID types.UID) (volume.Unmounter, error) {
	if spec.Volume != nil {
		spec.Volume.Name = "wrapped_" + volName
	}
	plugin, err := h.pluginMgr.FindPluginBySpec(&spec)
	if err != nil {
		return nil, err
	}
	return plugin.NewUnmounter(spec.Name(), podUID)
}

// GetNodeLabels returns the node's labels, as the kubelet's host does
// (the test kit's sets a default without a lock, which races).
func (h *realHost) GetNodeLabels() (map[string]string, error) { return h.node.Labels, nil }

func (h *realHost) GetMounter() mount.Interface           { return h.mounter }
func (h *realHost) GetHostUtil() hostutil.HostUtils       { return h.hostUtil }
func (h *realHost) GetPluginMgr() *volume.VolumePluginMgr { return h.pluginMgr }
func (h *realHost) GetAttachedVolumesFromNodeStatus() (map[v1.UniqueVolumeName]string, error) {
	return h.fakeKubeletHost.(interface {
		GetAttachedVolumesFromNodeStatus() (map[v1.UniqueVolumeName]string, error)
	}).GetAttachedVolumesFromNodeStatus()
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
	factory := informers.NewSharedInformerFactory(client, 0)
	driverLister := factory.Storage().V1().CSIDrivers().Lister()
	vaLister := factory.Storage().V1().VolumeAttachments().Lister()
	log := &errLog{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), log.logger()))
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	fakeHost := volumetest.NewFakeKubeletVolumeHostWithCSINodeName(e.t, e.root, client, nil, hvNode, driverLister, vaLister)
	fakeHost.WithNode(&o.node)
	mounter := mount.New("")
	host := &realHost{fakeKubeletHost: fakeHost, pluginMgr: &volume.VolumePluginMgr{}, mounter: mounter, hostUtil: hostutil.NewHostUtil(),
		subpather: subpath.New(mounter), tokens: token.NewManager(client), node: &o.node}
	if err := host.pluginMgr.InitPlugins(kubeletPlugins(), nil, host); err != nil {
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
