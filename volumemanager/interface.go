package volumemanager

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
)

// Interface is the kubelet's VolumeManager interface
// (pkg/kubelet/volumemanager/volume_manager.go) as far as it concerns CSI
// volumes, with the same method names and meanings, so that a kubelet fork
// can put nodevol where its volume manager was, and its tests a fake of it
// (volumemanager/vmtest.Fake). Where the kubelet's types live in
// k8s.io/kubernetes, nodevol's own stand in for them: a pod is named by
// its UID instead of a UniquePodName, a volume by podvol.UniqueVolumeName
// instead of v1.UniqueVolumeName (the same string), and the kubelet's
// container.VolumeMap is a []podvol.MountedVolume. Run takes no
// SourcesReady: MarkPodsSynced says what SourcesReady.AllReady says.
//
// Pod intake (AddPod, UpdatePod, DeletePod) is not part of it: the kubelet
// gives its volume manager a pod manager to read instead.
type Interface interface {
	// Run runs the manager until ctx is done and its operations have
	// returned.
	Run(ctx context.Context) error
	// MarkPodsSynced says that every pod running on the node has been
	// added: volumes found on disk at start may be torn down from now on.
	MarkPodsSynced()
	// WaitForAttachAndMount waits until every volume of pod is attached
	// and mounted, or returns why not.
	WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error
	// WaitForUnmount waits until no volume of pod is mounted or may be.
	WaitForUnmount(ctx context.Context, pod *v1.Pod) error
	// WaitForAllPodsUnmount is WaitForUnmount for several pods at once.
	WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error
	// GetMountedVolumesForPod returns the pod's volumes that are mounted.
	GetMountedVolumesForPod(uid types.UID) []podvol.MountedVolume
	// GetPossiblyMountedVolumesForPod returns the pod's volumes that are
	// mounted or may be (Uncertain, or an operation on them is running).
	GetPossiblyMountedVolumesForPod(uid types.UID) []podvol.MountedVolume
	// GetExtraSupplementalGroupsForPod returns the groups the pod needs
	// beyond its own to use its volumes.
	GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64
	// GetVolumesInUse returns, sorted, the attachable volumes that pods
	// want or that may still be set up: what Node.Status.VolumesInUse
	// should list (as the kubelet's, only volumes that are attached).
	GetVolumesInUse() []podvol.UniqueVolumeName
	// ReconcilerStatesHasBeenSynced reports whether the state found on disk
	// at start has been taken in and reconciled once: before that, a pod
	// directory without a known volume may still hold one.
	ReconcilerStatesHasBeenSynced() bool
	// VolumeIsAttached reports whether the volume's attachment has been
	// confirmed (or it needs none).
	VolumeIsAttached(name podvol.UniqueVolumeName) bool
	// MarkVolumesAsReportedInUse says which volumes the Node's
	// status.volumesInUse lists now.
	MarkVolumesAsReportedInUse(names []podvol.UniqueVolumeName)
}

var _ Interface = (*VolumeManager)(nil)

// GetPossiblyMountedVolumesForPod returns the pod's volumes that are
// mounted or may be: Mounted, Uncertain (a publish may have half-happened),
// or with an operation running. The kubelet removes a pod's directory only
// once this is empty (HasPossiblyMountedVolumesForPod says the same).
func (vm *VolumeManager) GetPossiblyMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	return vm.podVolumes(uid)
}

// ReconcilerStatesHasBeenSynced reports whether Run has taken in what an
// earlier run (or the kubelet) left on disk and the reconcile loop has made
// its first pass over it, as the kubelet's reconciler reports once its
// reconstruction is done. Until then a pod directory on disk may hold a
// volume the manager does not know yet: a kubelet fork does not clean up
// orphaned pod directories before this is true. False before Run.
func (vm *VolumeManager) ReconcilerStatesHasBeenSynced() bool { return vm.statesSynced.Load() }

// VolumeIsAttached reports whether the volume's attachment has been
// confirmed (its VolumeAttachment is attached, or the driver needs no
// attach) and it has not been torn down since.
func (vm *VolumeManager) VolumeIsAttached(name podvol.UniqueVolumeName) bool {
	v, ok := vm.asw.Volume(name)
	// A volume that needs no attach (a CSIDriver with attachRequired
	// false) is attached once it is known, as the kubelet's actual state
	// holds it from then on.
	return ok && (v.Attached || !vm.attachable(&v.Spec))
}

// MarkVolumesAsReportedInUse tells the manager which volumes the Node's
// status.volumesInUse lists now, after the caller's node status loop has
// written it (Config.VolumesInUseReportedByCaller): a volume that needs
// attaching is confirmed attached, and staged, only once it is listed, so
// that the attach/detach controller cannot detach a volume the node is
// about to use. Each call replaces the previous list, as with the kubelet;
// a volume already attached stays attached when it leaves the list.
//
// Without Config.VolumesInUseReportedByCaller it has no effect: with
// Config.ReportVolumesInUse the manager reports the volumes itself and
// knows what it wrote, and with neither nothing holds the attach.
func (vm *VolumeManager) MarkVolumesAsReportedInUse(names []podvol.UniqueVolumeName) {
	if vm.inUse == nil || !vm.inUse.byCaller {
		return
	}
	vm.inUse.markReported(names)
}
