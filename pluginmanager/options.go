package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Handler registers and deregisters the plugins of one type ("CSIPlugin").
// The manager calls it from several goroutines, but never twice at once for
// the same socket. Every method is bounded by its context.
type Handler interface {
	// ValidatePlugin checks a plugin's GetInfo answer before registration:
	// an error refuses the plugin, and its text is sent to the registrar.
	ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error
	// RegisterPlugin makes the plugin usable. On error nothing must remain
	// registered; the manager retries later.
	RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error
	// DeRegisterPlugin undoes RegisterPlugin for the plugin registered with
	// this name and endpoint. It is idempotent; on error the manager
	// retries later.
	DeRegisterPlugin(ctx context.Context, name, endpoint string) error
}

// Defaults of Options (their docs give the values).
const (
	defaultRPCTimeout     = 10 * time.Second
	defaultHandlerTimeout = 2 * time.Minute
	defaultInitialBackoff = 500 * time.Millisecond
	defaultMaxBackoff     = 2 * time.Minute
	defaultResyncPeriod   = time.Minute
)

// Options configures a Manager.
type Options struct {
	// Dir is the plugin registration directory, usually
	// {root}/plugins_registry. Required. Run creates it if missing.
	Dir string
	// Handlers maps a plugin type, as a registrar reports it in GetInfo
	// ("CSIPlugin", pluginregistration/v1.CSIPlugin), to its handler.
	// Plugins of other types are refused. Required: at least one.
	Handlers map[string]Handler
	// Clock is used for backoff and resync timers. Default: the real clock.
	Clock clock.WithTicker
	// RPCTimeout bounds each call to a registrar's socket: connecting plus
	// GetInfo, and NotifyRegistrationStatus. Default 10 s (the
	// kubelet's connection timeout).
	RPCTimeout time.Duration
	// HandlerTimeout bounds a handler's ValidatePlugin plus RegisterPlugin,
	// and its DeRegisterPlugin. Default 2 min (the kubelet's
	// CSI call timeout).
	HandlerTimeout time.Duration
	// InitialBackoff is the wait before the first retry of a failed
	// registration or deregistration; it doubles with each failure of the
	// same socket up to MaxBackoff, and is forgotten on success or when
	// the socket is created again. Default 500 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between retries. Default 2 min.
	MaxBackoff time.Duration
	// ResyncPeriod is how often the directory is rescanned in case an
	// fsnotify event was lost; events, not the rescan, drive registration.
	// Default 1 min.
	ResyncPeriod time.Duration
	// Registerer, if set, receives the kubelet's gauge
	// plugin_manager_total_plugins{socket_path,state}: 1 for each socket
	// found in Dir (desired_state_of_world) and each registered plugin
	// (actual_state_of_world). Default none.
	Registerer prometheus.Registerer
}

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, errors.New("pluginmanager: Options.Dir is required")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return o, fmt.Errorf("pluginmanager: Options.Dir: %w", err)
	}
	o.Dir = dir
	if len(o.Handlers) == 0 {
		return o, errors.New("pluginmanager: Options.Handlers needs at least one handler")
	}
	handlers := make(map[string]Handler, len(o.Handlers))
	for typ, h := range o.Handlers {
		if typ == "" || h == nil {
			return o, fmt.Errorf("pluginmanager: Options.Handlers: invalid entry for type %q", typ)
		}
		handlers[typ] = h
	}
	o.Handlers = handlers
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	o.RPCTimeout = orDefault(o.RPCTimeout, defaultRPCTimeout)
	o.HandlerTimeout = orDefault(o.HandlerTimeout, defaultHandlerTimeout)
	o.InitialBackoff = orDefault(o.InitialBackoff, defaultInitialBackoff)
	o.MaxBackoff = orDefault(o.MaxBackoff, defaultMaxBackoff)
	if o.MaxBackoff < o.InitialBackoff {
		o.MaxBackoff = o.InitialBackoff
	}
	o.ResyncPeriod = orDefault(o.ResyncPeriod, defaultResyncPeriod)
	return o, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
