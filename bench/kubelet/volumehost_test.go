package kubeletbench

import (
	"context"
	"fmt"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kubernetes/pkg/kubelet/token"
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
	"k8s.io/mount-utils"
)

// The kubelet's volume host with the plugins of every kind nodevol
// handles: the hand-over tests (on real mounts) and W6 (BenchmarkRealPods,
// on the fake mounter) run the kubelet's volume manager on it.

// fakeKubeletHost is what the volume test kit's kubelet volume host
// implements; realHost replaces its mounter and host utilities.
type fakeKubeletHost interface {
	volume.VolumeHost
	volume.KubeletVolumeHost
}

// realHost is the kubelet's volume host with a mounter, host utilities
// and subpather of its own (the test kit's host has fakes, in fields that
// cannot be set): real ones for the hand-over tests, fakes for W6. It has
// the kubelet's service account token manager and a plugin manager
// initialised with this host, so that the plugins see them and wrap each
// other through it (a secret's tmpfs is an emptyDir). The secret and
// configMap getters are the test kit's (GETs on the client, as the
// kubelet's Get strategy makes them) unless objects sets others.
type realHost struct {
	fakeKubeletHost
	pluginMgr *volume.VolumePluginMgr
	mounter   mount.Interface
	hostUtil  hostutil.HostUtils
	subpather subpath.Interface
	tokens    *token.Manager
	node      *v1.Node
	objects   *objectGetters
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

// hostConfig is what newVolumeHost builds the host of.
type hostConfig struct {
	root   string
	client *fake.Clientset
	node   *v1.Node
	// mounter, hostUtil and subpather are the host's: real ones on real
	// mounts, fakes for a benchmark.
	mounter   mount.Interface
	hostUtil  hostutil.HostUtils
	subpather subpath.Interface
	// objects, when set, are the getters of secrets and configMaps (the
	// kubelet's managers); unset, the test kit's, a GET on the client each.
	objects *objectGetters
	// plugins are the host's volume plugins; unset, kubeletPlugins().
	plugins []volume.VolumePlugin
}

// objectGetters are the secret and configMap getters the kubelet hands
// its volume plugins: its secret and configMap managers' GetSecret and
// GetConfigMap.
type objectGetters struct {
	secret    func(namespace, name string) (*v1.Secret, error)
	configMap func(namespace, name string) (*v1.ConfigMap, error)
}

// newVolumeHost builds the kubelet's volume host on the client: the CSI
// plugin's CSIDriver and VolumeAttachment listers (informers started on
// ctx and synced), the node, the kubelet's service account token manager,
// and a plugin manager of c.plugins (kubeletPlugins unset) initialised with
// the host.
func newVolumeHost(ctx context.Context, t *testing.T, c hostConfig) (*realHost, error) {
	factory := informers.NewSharedInformerFactory(c.client, 0)
	driverLister := factory.Storage().V1().CSIDrivers().Lister()
	vaLister := factory.Storage().V1().VolumeAttachments().Lister()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	fakeHost := volumetest.NewFakeKubeletVolumeHostWithCSINodeName(t, c.root, c.client, nil, c.node.Name, driverLister, vaLister)
	fakeHost.WithNode(c.node)
	host := &realHost{fakeKubeletHost: fakeHost, pluginMgr: &volume.VolumePluginMgr{}, mounter: c.mounter, hostUtil: c.hostUtil,
		subpather: c.subpather, tokens: token.NewManager(c.client), node: c.node, objects: c.objects}
	plugins := c.plugins
	if plugins == nil {
		plugins = kubeletPlugins()
	}
	if err := host.pluginMgr.InitPlugins(plugins, nil, host); err != nil {
		return nil, fmt.Errorf("initialising the kubelet's volume plugins: %w", err)
	}
	return host, nil
}

// GetSecretFunc is the secret getter of the plugins: the kubelet's secret
// manager's when set, else the test kit's.
func (h *realHost) GetSecretFunc() func(namespace, name string) (*v1.Secret, error) {
	if h.objects != nil {
		return h.objects.secret
	}
	return h.fakeKubeletHost.GetSecretFunc()
}

// GetConfigMapFunc is GetSecretFunc's counterpart for configMaps.
func (h *realHost) GetConfigMapFunc() func(namespace, name string) (*v1.ConfigMap, error) {
	if h.objects != nil {
		return h.objects.configMap
	}
	return h.fakeKubeletHost.GetConfigMapFunc()
}
