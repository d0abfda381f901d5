package volumemanager

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// newPluginManager returns the plugin manager that registers the CSI
// drivers announced in cfg.RegistrationDir in cfg.Drivers, recording them
// on the Node and CSINode, and the registration handler, which keeps the
// CSINode (see runRegistration).
func newPluginManager(cfg Config, csiDrivers storagelisters.CSIDriverLister) (*pluginmanager.Manager, *registration.Handler, error) {
	handler, err := registration.New(registration.Config{
		Registry:   cfg.Drivers,
		KubeClient: cfg.KubeClient,
		NodeName:   cfg.NodeName,
		CSIDrivers: csiDrivers,
		Clock:      cfg.Clock,
	})
	if err != nil {
		return nil, nil, err
	}
	m, err := pluginmanager.New(pluginmanager.Options{
		Dir:      cfg.RegistrationDir,
		Handlers: map[string]pluginmanager.Handler{registerapi.CSIPlugin: handler},
		Clock:    cfg.Clock,
		// plugin_manager_total_plugins, as the kubelet's.
		Registerer: cfg.Registerer,
	})
	return m, handler, err
}

// runRegistration keeps the CSINode until ctx ends: created at start,
// drivers' allocatable counts refreshed (nothing without
// Config.PluginRegistration).
func (vm *VolumeManager) runRegistration(ctx context.Context) {
	if vm.registration != nil {
		_ = vm.registration.Run(ctx) // returns ctx.Err()
	}
}

// resourceExhausted refreshes at once the allocatable count of the driver
// of a volume (with Config.PluginRegistration, when its CSIDriver sets
// nodeAllocatableUpdatePeriodSeconds) whose VolumeAttachment failed with
// ResourceExhausted, as the kubelet does (it refreshes when its wait for
// the pod's volumes times out; nodevol as soon as it sees the error, so
// that the scheduler stops placing pods with such volumes here sooner), or
// whose NodeStageVolume or NodePublishVolume did: the kubelet does not
// refresh for those, but a driver that counts its volumes at stage says
// so by that code, and the refresh costs one NodeGetInfo.
func (vm *VolumeManager) resourceExhausted(o oe.Outcome) {
	if vm.registration == nil || o.Err == nil {
		return
	}
	var limit *volume.AttachLimitError
	switch o.Action.Kind {
	case oe.OpAttach, oe.OpSelfAttach:
		if !errors.As(o.Err, &limit) {
			return
		}
	case oe.OpStage, oe.OpPublish:
		if !csi.IsResourceExhausted(o.Err) {
			return
		}
	default:
		return
	}
	vm.registration.ResourceExhausted(o.Spec.Driver)
}

// SetNodeAttachMode sets the Node annotation
// volumes.kubernetes.io/controller-managed-attach-detach as the manager's
// attach mode says (Config.SelfAttach: absent; else "true") and reports
// whether it changed node. A node agent calls it on its Node before it
// creates or updates it, as the kubelet does when it registers its Node:
// without the annotation the attach/detach controller never attaches
// volumes to the node.
func (vm *VolumeManager) SetNodeAttachMode(node *v1.Node) bool {
	return registration.SetNodeAttachMode(node, vm.cfg.SelfAttach)
}

// runPluginManager runs the plugin manager, if any, until ctx ends. A
// directory that cannot be watched is logged: drivers can still be
// registered through Drivers().Register.
func (vm *VolumeManager) runPluginManager(ctx context.Context) {
	if vm.plugins == nil {
		return
	}
	if err := vm.plugins.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		klog.FromContext(ctx).Error(err, "Plugin registration stopped", "dir", vm.cfg.RegistrationDir)
	}
}

// Plugins returns the plugins registered through the registration
// directory, sorted by socket path; nil without Config.PluginRegistration.
func (vm *VolumeManager) Plugins() []pluginmanager.PluginInfo {
	if vm.plugins == nil {
		return nil
	}
	return vm.plugins.Plugins()
}
