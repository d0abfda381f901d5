package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// managerHost is the manager as the loop's host (reconciler.Host): the loop's
// one way out. A job the Config leaves out (in-use reporting, health
// probes, attachments held in the object cache) is a method that does
// nothing, decided here rather than by a nil hook.
type managerHost struct{ vm *VolumeManager }

// Start tells the health probes of a stage or publish (as the kubelet's
// markVolumeMountAsAttempted: they ask about those volumes even when they
// fail), then runs the operation.
func (h managerHost) Start(a oe.Action, in reconciler.Input) {
	vm := h.vm
	if vm.health != nil && vm.cfg.VolumeHealth.Updater != nil && (a.Kind == oe.OpStage || a.Kind == oe.OpPublish) {
		vm.health.attempt(a)
	}
	vm.start(a, in)
}

func (h managerHost) HoldPod(uid types.UID, pod *v1.Pod) {
	if pod == nil {
		h.vm.podGone(uid)
		return
	}
	h.vm.holdObjects(uid, pod)
}

// HoldAttachment makes volume name hold the VolumeAttachment va in the
// object cache ("": none); with Config.ClusterInformers the informers
// read attachments, and nothing is held.
func (h managerHost) HoldAttachment(name podvol.UniqueVolumeName, va string) {
	vm := h.vm
	switch {
	case vm.cfg.ClusterInformers:
	case va == "":
		vm.objects.Release(resolve.AttachmentHolder(name))
	default:
		vm.objects.Hold(resolve.AttachmentHolder(name), objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: va})
	}
}

// AttachHeld: without in-use reporting no attachment waits for it.
func (h managerHost) AttachHeld(name podvol.UniqueVolumeName) bool {
	return h.vm.inUse != nil && h.vm.inUse.hold(name)
}

func (h managerHost) Forgotten() { h.vm.inUse.changed() } // nil-safe

func (h managerHost) Retake(dir string) bool { return h.vm.retakeUnreadable(dir) }
