package volumemanager

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	oe "github.com/nodevol/nodevol/internal/operationexecutor"
	"github.com/nodevol/nodevol/internal/registration"
	"github.com/nodevol/nodevol/pluginmanager"
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

// resourceExhausted refreshes the allocatable count of the driver of a
// NodeStageVolume or NodePublishVolume that failed with ResourceExhausted
// (with Config.PluginRegistration, when its CSIDriver sets
// nodeAllocatableUpdatePeriodSeconds). This is nodevol's choice, not the
// kubelet's: the kubelet 1.37 refreshes the count after a
// ResourceExhausted only when a VolumeAttachment's attachError says so
// (VerifyExhaustedResource, once WaitForAttachAndMount timed out), and
// never after a failed NodeStage or NodePublish. A driver out of room on
// the node says so through them, and the scheduler sees the new count
// sooner.
func (vm *VolumeManager) resourceExhausted(o oe.Outcome) {
	if vm.registration == nil || o.Err == nil || (o.Action.Kind != oe.OpStage && o.Action.Kind != oe.OpPublish) {
		return
	}
	if status.Code(o.Err) == codes.ResourceExhausted {
		vm.registration.ResourceExhausted(o.Spec.Driver)
	}
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
