package volumemanager

import (
	"context"
	"errors"

	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/pluginmanager"
)

// newPluginManager returns the plugin manager that registers the CSI
// drivers announced in cfg.RegistrationDir in cfg.Drivers, recording them
// on the Node and CSINode.
func newPluginManager(cfg Config) (*pluginmanager.Manager, error) {
	handler, err := csiplugin.NewRegistrationHandler(csiplugin.RegistrationConfig{
		Registry:   cfg.Drivers,
		KubeClient: cfg.KubeClient,
		NodeName:   cfg.NodeName,
	})
	if err != nil {
		return nil, err
	}
	return pluginmanager.New(pluginmanager.Options{
		Dir:      cfg.RegistrationDir,
		Handlers: map[string]pluginmanager.Handler{registerapi.CSIPlugin: handler},
		Clock:    cfg.Clock,
		// plugin_manager_total_plugins, as the kubelet's.
		Registerer: cfg.Registerer,
	})
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
