package registration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/backoff"
)

// Config configures a Handler.
type Config struct {
	// Registry receives the registered drivers. Required.
	Registry *csi.Registry
	// KubeClient updates the Node (NodeIDAnnotation, topology labels) and
	// the CSINode object. Default nil: drivers are registered in Registry
	// only, and nothing is recorded in the API (for tests and agents
	// without an API server).
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

// Handler registers CSI drivers announced through plugin
// registration: it is the pluginmanager.Handler for the "CSIPlugin" type,
// as the kubelet's CSI plugin is. Safe for concurrent use.
type Handler struct {
	registry *csi.Registry
	nodeInfo *nodeInfo // nil without a KubeClient
	// refresh keeps allocatable counts current; nil without a KubeClient
	// or CSIDrivers.
	refresh *refresher
	clock   clock.Clock // times Run's retries

	mu      sync.Mutex
	drivers map[string]*registration
}

// registration is a driver registered, or being registered, through the
// handler.
type registration struct {
	endpoint string
	version  *version.Version
	pending  bool
}

// New returns a handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Registry == nil {
		return nil, errors.New("registration: Config.Registry is required")
	}
	h := &Handler{registry: cfg.Registry, drivers: map[string]*registration{}, clock: cfg.Clock}
	if h.clock == nil {
		h.clock = clock.RealClock{}
	}
	if cfg.KubeClient != nil {
		if cfg.NodeName == "" {
			return nil, errors.New("registration: Config.NodeName is required with a KubeClient")
		}
		h.nodeInfo = &nodeInfo{client: cfg.KubeClient, nodeName: cfg.NodeName}
		if cfg.CSIDrivers != nil {
			h.refresh = newRefresher(h, cfg.CSIDrivers, cfg.Clock)
		}
	}
	return h, nil
}

// HighestSupportedVersion returns the highest 1.x version in versions, as
// the kubelet accepts only CSI 1.x. Unparseable entries are skipped; no 1.x
// version at all is an error.
func HighestSupportedVersion(versions []string) (*version.Version, error) {
	var highest *version.Version
	for _, s := range versions {
		v, err := version.ParseGeneric(s)
		if err != nil || v.Major() != 1 {
			continue
		}
		if highest == nil || highest.LessThan(v) {
			highest = v
		}
	}
	if highest == nil {
		return nil, fmt.Errorf("no supported CSI version in %q: nodevol supports 1.x", versions)
	}
	return highest, nil
}

// ValidatePlugin checks a driver's registration: a valid name, a supported
// version, and no registration of the same name at an equal or higher
// version (a second registrar claiming a registered driver is refused, as
// the kubelet refuses it).
func (h *Handler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.validateLocked(name, endpoint, versions)
	if err != nil {
		klog.FromContext(ctx).Info("Refusing CSI driver registration", "driver", name, "endpoint", endpoint, "versions", versions, "reason", err.Error())
	}
	return err
}

func (h *Handler) validateLocked(name, endpoint string, versions []string) (*version.Version, error) {
	if err := csi.ValidateDriverName(name); err != nil {
		return nil, err
	}
	if endpoint == "" {
		return nil, fmt.Errorf("CSI driver %s has an empty endpoint", name)
	}
	v, err := HighestSupportedVersion(versions)
	if err != nil {
		return nil, fmt.Errorf("CSI driver %s: %w", name, err)
	}
	if old := h.drivers[name]; old != nil {
		if old.pending {
			return nil, fmt.Errorf("CSI driver %s is being registered from endpoint %s", name, old.endpoint)
		}
		if !old.version.LessThan(v) {
			return nil, fmt.Errorf("CSI driver %s is already registered at endpoint %s with version %s, not lower than %s",
				name, old.endpoint, old.version, v)
		}
	}
	return v, nil
}

// RegisterPlugin registers driver name at endpoint in the registry (a kept
// connection, node capabilities), asks it for its node information
// (NodeGetInfo) and records it on the Node and CSINode. On failure the
// driver is not registered.
func (h *Handler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error {
	h.mu.Lock()
	v, err := h.validateLocked(name, endpoint, versions)
	if err != nil {
		h.mu.Unlock()
		return err
	}
	prev := h.drivers[name]
	h.drivers[name] = &registration{endpoint: endpoint, version: v, pending: true}
	h.mu.Unlock()

	replaced, err := h.register(ctx, name, endpoint)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.drivers[name].pending = false
		klog.FromContext(ctx).V(2).Info("Registered CSI driver", "driver", name, "endpoint", endpoint, "version", v)
		h.kickRefresh()
	case prev != nil && !replaced:
		h.drivers[name] = prev
	default:
		delete(h.drivers, name)
	}
	return err
}

// register does RegisterPlugin's work and reports whether it changed the
// registry; on failure after changing it, it removes the driver again.
func (h *Handler) register(ctx context.Context, name, endpoint string) (replaced bool, err error) {
	if err := h.registry.Register(ctx, name, endpoint); err != nil {
		return false, err
	}
	err = h.recordNode(ctx, name)
	if err == nil {
		return true, nil
	}
	h.registry.Deregister(name)
	if h.nodeInfo != nil {
		if uerr := h.nodeInfo.uninstall(ctx, name); uerr != nil {
			klog.FromContext(ctx).Error(uerr, "Rolling back CSI driver registration failed", "driver", name)
		}
	}
	return true, err
}

// recordNode asks the registered driver for its node information and
// records it.
func (h *Handler) recordNode(ctx context.Context, name string) error {
	client, err := h.registry.Client(name)
	if err != nil {
		return err
	}
	info, err := client.NodeGetInfo(ctx)
	if err != nil {
		return fmt.Errorf("registering CSI driver %s: %w", name, err)
	}
	if h.nodeInfo == nil {
		return nil
	}
	return h.nodeInfo.install(ctx, name, info)
}

// DeRegisterPlugin removes driver name registered at endpoint from the
// registry, the Node annotation and the CSINode. It does nothing when name
// is not registered, or registered from another endpoint (a registrar
// that replaced it with a higher version). On error the driver stays known
// to the handler, so that a retry finishes the job.
func (h *Handler) DeRegisterPlugin(ctx context.Context, name, endpoint string) error {
	h.mu.Lock()
	r := h.drivers[name]
	if r == nil || r.endpoint != endpoint {
		h.mu.Unlock()
		return nil
	}
	if r.pending {
		h.mu.Unlock()
		return fmt.Errorf("CSI driver %s at endpoint %s is being registered or deregistered", name, endpoint)
	}
	r.pending = true
	h.mu.Unlock()

	h.registry.Deregister(name)
	var err error
	if h.nodeInfo != nil {
		err = h.nodeInfo.uninstall(ctx, name)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		r.pending = false
		return err
	}
	delete(h.drivers, name)
	klog.FromContext(ctx).V(2).Info("Deregistered CSI driver", "driver", name, "endpoint", endpoint)
	h.kickRefresh()
	return nil
}

// csinodeRetry is the backoff of Run's CSINode creation, with jitter:
// after an API server outage the nodes do not all retry at once.
var csinodeRetry = backoff.Policy{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Jitter: backoff.APIJitter}

// Run keeps the node's CSINode as the kubelet does, until ctx ends: it
// creates it at once, owned by the Node and before any driver registers
// (retried with backoff, up to 36 s apart, while the Node is missing or the
// API fails: a missing Node is logged at V(2) only, as a wait, an API
// failure as an error), then refreshes the registered drivers' allocatable counts
// (see Config.CSIDrivers). Without a KubeClient it returns at
// once. It returns ctx.Err().
func (h *Handler) Run(ctx context.Context) error {
	if h.nodeInfo == nil {
		return nil
	}
	logger := klog.FromContext(ctx)
	lastErr := ""
	for failures := 1; ; failures++ {
		err := h.nodeInfo.initCSINode(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		delay := csinodeRetry.Delay(failures)
		switch {
		case err.Error() == lastErr:
		case errors.Is(err, errNodeNotRegistered):
			// A first start: the kubelet (or the agent) registers the
			// Node meanwhile. The kubelet logs such an attempt at V(2).
			logger.V(2).Info("Waiting for the Node to be registered before creating the CSINode", "node", h.nodeInfo.nodeName, "retryAfter", delay)
		default:
			logger.Error(err, "Cannot initialize the CSINode yet: retrying", "node", h.nodeInfo.nodeName, "retryAfter", delay)
		}
		lastErr = err.Error()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.clock.After(delay):
		}
	}
	if h.refresh != nil {
		h.refresh.run(ctx)
	}
	<-ctx.Done()
	return ctx.Err()
}

// CSIDriverChanged tells the handler that a CSIDriver object changed: its
// nodeAllocatableUpdatePeriodSeconds may have.
func (h *Handler) CSIDriverChanged(string) { h.kickRefresh() }

// ResourceExhausted tells the handler that the node ran out of driver's
// volumes: a VolumeAttachment failed with ResourceExhausted (the kubelet
// refreshes then), or a NodeStageVolume or NodePublishVolume did. The
// driver's allocatable count is refreshed at once, when its CSIDriver sets
// a refresh period (as the kubelet does).
func (h *Handler) ResourceExhausted(driver string) {
	if h.refresh != nil {
		h.refresh.resourceExhausted(driver)
	}
}

func (h *Handler) kickRefresh() {
	if h.refresh != nil {
		h.refresh.kick()
	}
}

// registered returns the names of the drivers registered (not being
// registered or deregistered), sorted.
func (h *Handler) registered() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.drivers))
	for name, r := range h.drivers {
		if !r.pending {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
