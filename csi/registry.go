package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/volume"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

// RegistryOptions configures a Registry. The zero value is ready to use.
type RegistryOptions struct {
	// CallTimeout bounds each CSI call made through the registry's clients
	// (the caller's context may end it sooner). Default DefaultCallTimeout.
	CallTimeout time.Duration
	// DialOptions are added to the options every connection is made with
	// (interceptors for metrics or tracing, for example). Default none.
	DialOptions []grpc.DialOption
	// Registerer, when set, gets csi_operations_seconds, the kubelet's
	// histogram of CSI calls by driver, method and gRPC status code.
	Registerer prometheus.Registerer
}

// Registry is the set of registered CSI drivers: for each, one kept gRPC
// connection to its endpoint and its node capabilities. It is safe for
// concurrent use. The plugin registration flow calls Register and
// Deregister; the volume plugin looks drivers up with Client.
type Registry struct {
	opts    RegistryOptions
	metrics *callMetrics
	// dials counts the connections made to driver sockets (every
	// attempt, successful or not): one per registered endpoint plus one
	// per reconnection.
	dials atomic.Int64
	// regMu serializes Register, Deregister and Close, so that a
	// connection is never closed under a registration that reuses it.
	regMu sync.Mutex

	mu        sync.RWMutex
	drivers   map[string]*Client
	listeners []func(driver string)
	closed    bool
}

// NewRegistry returns an empty registry.
func NewRegistry(opts RegistryOptions) *Registry {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	return &Registry{opts: opts, metrics: newCallMetrics(opts.Registerer), drivers: map[string]*Client{}}
}

// Register registers driver name at endpoint, the path of its unix socket
// ("unix://" prefix optional): it makes a connection, fetches the driver's
// node capabilities (NodeGetCapabilities) and then makes the driver
// available, replacing an earlier registration of the same name. A
// registration always makes a new connection: the driver behind the
// endpoint may have restarted, and an old connection may still be backing
// off from its failure. The replaced connection is closed, which cancels
// calls still running on it (they fail in progress and are retried). On
// error nothing changes. Listeners (OnChange) are told afterwards.
func (r *Registry) Register(ctx context.Context, name, endpoint string) error {
	if err := fsutil.ValidateName("driver name", name); err != nil {
		return fmt.Errorf("registering CSI driver: %w", err)
	}
	path, err := socketPath(endpoint)
	if err != nil {
		return fmt.Errorf("registering CSI driver %s: %w", name, err)
	}
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.mu.RLock()
	closed := r.closed
	r.mu.RUnlock()
	if closed {
		return fmt.Errorf("registering CSI driver %s: registry is closed", name)
	}
	conn, err := r.dial(name, path)
	if err != nil {
		return fmt.Errorf("registering CSI driver %s at %s: %w", name, path, err)
	}
	c := &Client{driver: name, conn: conn, node: csipb.NewNodeClient(conn), timeout: r.opts.CallTimeout}
	resp, err := call(ctx, c, "NodeGetCapabilities", &csipb.NodeGetCapabilitiesRequest{}, c.node.NodeGetCapabilities)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("registering CSI driver %s at %s: %w", name, path, err)
	}
	c.caps = capabilitiesFrom(resp)

	r.mu.Lock()
	prev := r.drivers[name]
	r.drivers[name] = c
	listeners := r.listeners
	r.mu.Unlock()
	if prev != nil {
		_ = prev.conn.Close()
	}
	klog.FromContext(ctx).V(2).Info("Registered CSI driver", "driver", name, "endpoint", path, "capabilities", c.caps)
	notify(listeners, name)
	return nil
}

// socketPath turns an endpoint into an absolute socket path.
func socketPath(endpoint string) (string, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if path == "" {
		return "", errors.New("empty endpoint")
	}
	if strings.IndexByte(path, 0) >= 0 {
		return "", fmt.Errorf("invalid endpoint %q", endpoint)
	}
	return filepath.Abs(path)
}

// dial makes a connection to a unix socket. grpc.NewClient connects lazily
// and reconnects by itself after a failure; every real connection attempt
// goes through the counting dialer.
func (r *Registry) dial(driver, path string) (*grpc.ClientConn, error) {
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		r.dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(dialer),
	}, r.opts.DialOptions...)
	if r.metrics != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(r.metrics.interceptor(driver)))
	}
	return grpc.NewClient("unix://"+path, opts...)
}

// Deregister removes driver name and closes its connection; calls still
// running on it end with codes.Canceled. Unknown names are ignored.
// Listeners (OnChange) are told.
func (r *Registry) Deregister(name string) {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.mu.Lock()
	c := r.drivers[name]
	delete(r.drivers, name)
	listeners := r.listeners
	r.mu.Unlock()
	if c == nil {
		return
	}
	_ = c.conn.Close()
	notify(listeners, name)
}

// Client returns the client of a registered driver. For a driver that is
// not registered the error wraps volume.ErrNotReady: the
// operation waits until the driver registers.
func (r *Registry) Client(name string) (*Client, error) {
	r.mu.RLock()
	c := r.drivers[name]
	r.mu.RUnlock()
	if c == nil {
		return nil, fmt.Errorf("driver name %s not found in the list of registered CSI drivers: %w", name, volume.ErrNotReady)
	}
	return c, nil
}

// Drivers returns the names of the registered drivers, in no order.
func (r *Registry) Drivers() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Collect(maps.Keys(r.drivers))
}

// OnChange adds f to the functions called, with the driver's name, after a
// driver is registered, registered again or deregistered: the reconciler
// uses it to retry that driver's volumes. f is called synchronously from
// Register or Deregister and must not block or call back into the registry
// under its own locks.
func (r *Registry) OnChange(f func(driver string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners[:len(r.listeners):len(r.listeners)], f)
}

func notify(listeners []func(string), name string) {
	for _, f := range listeners {
		f(name)
	}
}

// Close deregisters every driver and closes their connections. Register
// fails afterwards.
func (r *Registry) Close() error {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.mu.Lock()
	drivers := r.drivers
	r.drivers = map[string]*Client{}
	r.closed = true
	r.mu.Unlock()
	var errs []error
	for _, c := range drivers {
		errs = append(errs, c.conn.Close())
	}
	return errors.Join(errs...)
}
