// Package adapter is nodevol in the kubelet v1.37's place: a
// volumemanager.VolumeManager of k8s.io/kubernetes/pkg/kubelet/volumemanager
// built by New, whose signature is the kubelet's NewVolumeManager, so that a
// kubelet fork sets its NewVolumeManager hook to it (cmd/kubelet). The
// kubelet gives it what it gives its own volume manager: its pod manager
// and pod workers as the pod source, its client, mounter, pods directory,
// event recorder and status manager. nodevol does all the volume work with
// its own plugins; the kubelet's volume plugin manager, host utilities and
// block path handler are not used.
//
// The kubelet's plugin manager hands CSI drivers' registrations to the
// adapter (it is a plugincache.PluginHandler), which registers them with
// nodevol and records them in the Node and CSINode objects.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager/volumehealth"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	volumetypes "k8s.io/kubernetes/pkg/volume/util/types"
	"k8s.io/kubernetes/pkg/volume/util/volumepathhandler"
	"k8s.io/mount-utils"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/registration"
	nvm "github.com/nodevol/nodevol/volumemanager"
)

// Manager is nodevol behind the kubelet's VolumeManager interface, and the
// kubelet's CSI plugin registration handler.
type Manager struct {
	vm           *nvm.VolumeManager
	factory      informers.SharedInformerFactory
	registration *registration.Handler
	pods         *populator
}

var (
	_ volumemanager.VolumeManager = (*Manager)(nil)
)

// New builds nodevol for the kubelet, with the arguments of the kubelet's
// volumemanager.NewVolumeManager. nodevol's configuration follows from
// them: the root directory is podsDir's parent; the node attaches volumes
// itself when controllerAttachDetachEnabled is false; claims, volumes and
// attachments are read one at a time, as the Node authorizer allows a
// kubelet; the kubelet's node status reports volumesInUse and its metrics
// endpoint the volume stats (through each volume's GetMetrics); volume
// health is probed when the kubelet's CSIVolumeHealth feature is on;
// flexVolume drivers are found in volumePluginDir, the kubelet's
// --volume-plugin-dir. The plugin manager, host utilities and block path
// handler are unused: nodevol has its own.
func New(controllerAttachDetachEnabled bool, nodeName types.NodeName, podManager volumemanager.PodManager,
	podStateProvider volumemanager.PodStateProvider, kubeClient clientset.Interface, _ *volume.VolumePluginMgr,
	mounter mount.Interface, _ hostutil.HostUtils, podsDir string, recorder record.EventRecorder,
	_ volumepathhandler.BlockVolumePathHandler, healthUpdater volumehealth.StatusUpdater,
	healthProbeInterval time.Duration, volumePluginDir string) (volumemanager.VolumeManager, error) {
	m, err := newManager(options{
		volumePluginDir: volumePluginDir,
		selfAttach:      !controllerAttachDetachEnabled,
		nodeName:        string(nodeName),
		podManager:      podManager,
		podState:        podStateProvider,
		client:          kubeClient,
		mounter:         mounter,
		rootDir:         filepath.Dir(podsDir),
		recorder:        recorder,
		health:          healthUpdater,
		statsPeriod:     healthProbeInterval,
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// options is what New takes from the kubelet, and what tests give.
type options struct {
	selfAttach  bool
	nodeName    string
	podManager  volumemanager.PodManager
	podState    volumemanager.PodStateProvider
	client      clientset.Interface
	mounter     mount.Interface
	rootDir     string
	recorder    record.EventRecorder
	health      volumehealth.StatusUpdater
	statsPeriod time.Duration
	// volumePluginDir is the directory of flexVolume drivers ("": nodevol's
	// default, the kubelet's).
	volumePluginDir string
	// mutate, if set, changes nodevol's configuration last (tests: a
	// registerer of their own, a fake mounter, a shorter resync).
	mutate func(*nvm.Config)
}

func newManager(c options) (*Manager, error) {
	factory := informers.NewSharedInformerFactory(c.client, 0)
	cfg := nvm.Config{
		NodeName:                     c.nodeName,
		KubeClient:                   c.client,
		RootDir:                      c.rootDir,
		Mounter:                      c.mounter,
		Registerer:                   legacyregistry.Registerer(),
		EventRecorder:                c.recorder,
		InformerFactory:              factory,
		SelfAttach:                   c.selfAttach,
		VolumesInUseReportedByCaller: true,
		VolumeStatsCollectedByCaller: true,
		EnvReadByCaller:              false, // the kubelet reads env through ObjectManagers
		VolumeStatsPeriod:            c.statsPeriod,
		VolumePluginDir:              c.volumePluginDir,
		// The kubelet's eviction manager reads each emptyDir's usage
		// (GetMetrics) and evicts a pod over a sizeLimit with its own
		// event: nodevol reports nothing of its own, as the stock
		// kubelet shows nothing more.
		SizeLimit: nvm.SizeLimitConfig{Off: true},
	}
	if c.health != nil && utilfeature.DefaultFeatureGate.Enabled(features.CSIVolumeHealth) {
		cfg.VolumeHealth = &nvm.VolumeHealthConfig{ProbeInterval: c.statsPeriod, Updater: healthUpdater{c.health}}
	}
	if c.mutate != nil {
		c.mutate(&cfg)
	}
	vm, err := nvm.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("nodevol: %w", err)
	}
	reg, err := registration.New(registration.Config{
		Registry:   vm.Drivers(),
		KubeClient: c.client,
		NodeName:   c.nodeName,
		CSIDrivers: factory.Storage().V1().CSIDrivers().Lister(),
	})
	if err != nil {
		return nil, fmt.Errorf("nodevol: CSI plugin registration: %w", err)
	}
	return &Manager{vm: vm, factory: factory, registration: reg, pods: newPopulator(vm, c.podManager, c.podState)}, nil
}

// Run runs nodevol, its CSINode upkeep and the pod intake until ctx ends.
// The pods the kubelet's sources have delivered when they are all ready
// are the full set: volumes found on disk at start that none of them wants
// are torn down from then on (nodevol's MarkPodsSynced).
func (m *Manager) Run(ctx context.Context, sourcesReady config.SourcesReady) {
	logger := klog.FromContext(ctx)
	go func() {
		if err := m.registration.Run(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Keeping the CSINode object stopped")
		}
	}()
	go m.pods.run(ctx, sourcesReady)
	if err := m.vm.Run(ctx); err != nil && ctx.Err() == nil {
		logger.Error(err, "nodevol's volume manager stopped")
	}
}

// WaitForAttachAndMount adds the pod if the pod manager's intake has not
// yet and waits for its volumes (nodevol's WaitForAttachAndMount). A pod
// refused because its node has reached a driver's attach limit gets the
// kubelet's *VolumeAttachLimitExceededError, which makes the kubelet reject
// it.
func (m *Manager) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	m.pods.add(klog.FromContext(ctx), pod)
	return kubeletError(m.vm.WaitForAttachAndMount(ctx, pod))
}

// WaitForUnmount removes the pod from the desired state if its containers
// are gone, and waits until none of its volumes may be mounted.
func (m *Manager) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	m.pods.removeIfGone(pod.UID)
	return m.vm.WaitForUnmount(ctx, pod)
}

// WaitForAllPodsUnmount is WaitForUnmount for several pods at once.
func (m *Manager) WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error {
	for _, p := range pods {
		m.pods.removeIfGone(p.UID)
	}
	return m.vm.WaitForAllPodsUnmount(ctx, pods)
}

// GetMountedVolumesForPod returns the pod's mounted volumes by their name
// in pod.spec.volumes, each with a mounter (or, for a raw block volume, a
// block mapper) whose path is where nodevol put it.
func (m *Manager) GetMountedVolumesForPod(podName volumetypes.UniquePodName) kubecontainer.VolumeMap {
	return volumeMap(m.vm, types.UID(podName), m.vm.GetMountedVolumesForPod(types.UID(podName)))
}

// HasPossiblyMountedVolumesForPod reports whether a volume of the pod is
// mounted, may be (Uncertain), or has an operation running.
func (m *Manager) HasPossiblyMountedVolumesForPod(podName volumetypes.UniquePodName) bool {
	return m.vm.HasPossiblyMountedVolumesForPod(types.UID(podName))
}

// GetExtraSupplementalGroupsForPod returns the groups of the pod's PVs'
// pv.beta.kubernetes.io/gid annotations that the pod lacks.
func (m *Manager) GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64 {
	return m.vm.GetExtraSupplementalGroupsForPod(pod)
}

// GetVolumesInUse returns the volumes the node status reports in use.
func (m *Manager) GetVolumesInUse() []v1.UniqueVolumeName {
	names := m.vm.GetVolumesInUse()
	out := make([]v1.UniqueVolumeName, len(names))
	for i, n := range names {
		out[i] = v1.UniqueVolumeName(n)
	}
	return out
}

// ReconcilerStatesHasBeenSynced reports whether the state found on disk at
// start has been taken in.
func (m *Manager) ReconcilerStatesHasBeenSynced() bool { return m.vm.ReconcilerStatesHasBeenSynced() }

// VolumeIsAttached reports whether the volume's attachment is confirmed.
func (m *Manager) VolumeIsAttached(name v1.UniqueVolumeName) bool {
	return m.vm.VolumeIsAttached(podvol.UniqueVolumeName(name))
}

// MarkVolumesAsReportedInUse tells nodevol what the Node's
// status.volumesInUse lists now: a volume to attach is used only after.
func (m *Manager) MarkVolumesAsReportedInUse(names []v1.UniqueVolumeName) {
	in := make([]podvol.UniqueVolumeName, len(names))
	for i, n := range names {
		in[i] = podvol.UniqueVolumeName(n)
	}
	m.vm.MarkVolumesAsReportedInUse(in)
}

// ErrResizeNotSupported is ResizeEphemeralVolume's error: nodevol does
// not resize an emptyDir (the kubelet's alpha ResizeEphemeralVolume).
var ErrResizeNotSupported = errors.New("resizing an ephemeral volume is not supported by nodevol")

// ResizeEphemeralVolume refuses: see ErrResizeNotSupported.
func (m *Manager) ResizeEphemeralVolume(pod *v1.Pod, volumeName string, _ *resource.Quantity) error {
	return fmt.Errorf("volume %q of pod %s/%s: %w", volumeName, pod.Namespace, pod.Name, ErrResizeNotSupported)
}
