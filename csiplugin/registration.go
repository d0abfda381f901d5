package csiplugin

import (
	"context"

	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/registration"
	"github.com/nodevol/nodevol/pluginmanager"
)

// RegistrationConfig configures the handler NewRegistrationHandler returns.
type RegistrationConfig struct {
	// Registry receives the registered drivers. Required.
	Registry *csi.Registry
	// KubeClient updates the Node (the csi.volume.kubernetes.io/nodeid
	// annotation, topology labels) and the CSINode object. Default nil:
	// drivers are registered in Registry only, and nothing is recorded in
	// the API (for tests and agents without an API server).
	KubeClient kubernetes.Interface
	// NodeName is the name of this node's Node and CSINode objects.
	// Required when KubeClient is set.
	NodeName string
	// CSIDrivers reads the CSIDriver objects, whose
	// nodeAllocatableUpdatePeriodSeconds says how often Run refreshes a
	// driver's allocatable count in the CSINode. Default nil: never
	// refreshed (the count read at registration stays).
	CSIDrivers storagelisters.CSIDriverLister
	// Clock times the refreshes and Run's retries. Default the real clock.
	Clock clock.Clock
}

// RegistrationHandler registers the CSI drivers announced through plugin
// registration: the pluginmanager.Handler for the "CSIPlugin" type, as the
// kubelet's CSI plugin is. Run keeps the node's CSINode as the kubelet
// does until ctx ends: it creates it at once, before any driver registers
// (retried with backoff while the Node is missing or the API fails), then
// refreshes the drivers' allocatable counts (RegistrationConfig.CSIDrivers).
// Without a KubeClient it returns at once; otherwise it returns ctx.Err().
type RegistrationHandler interface {
	pluginmanager.Handler
	Run(ctx context.Context) error
}

// NewRegistrationHandler returns the handler that registers CSI drivers
// in cfg.Registry and records them in the Node and CSINode objects. It
// fails without a Registry, or with a KubeClient but no NodeName.
func NewRegistrationHandler(cfg RegistrationConfig) (RegistrationHandler, error) {
	h, err := registration.New(registration.Config(cfg))
	if err != nil {
		return nil, err
	}
	return h, nil
}
