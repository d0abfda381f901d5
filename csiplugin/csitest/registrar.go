package csitest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// RegistrarConfig configures a Registrar.
type RegistrarConfig struct {
	// Dir is the plugin registration directory ({root}/plugins_registry).
	// Required; it must exist.
	Dir string
	// DriverName is the name sent in GetInfo. It may be anything, even
	// invalid, to test refusals.
	DriverName string
	// Endpoint is the CSI driver's socket sent in GetInfo. Default empty:
	// the registering side then uses the registration socket itself.
	Endpoint string
	// Versions are the supported CSI versions sent in GetInfo. Default
	// ["1.0.0"].
	Versions []string
	// Type is the plugin type sent in GetInfo. Default "CSIPlugin".
	Type string
	// SocketName is the registration socket's name in Dir. Default
	// DriverName + "-reg.sock", as node-driver-registrar names it; it must
	// be set when DriverName is not a plain file name.
	SocketName string
}

// RegistrarStatus is one NotifyRegistrationStatus call a Registrar received.
type RegistrarStatus struct {
	// Registered is the status's plugin_registered.
	Registered bool
	// Error is the reason given when Registered is false.
	Error string
}

// Registrar plays node-driver-registrar's part in plugin registration: it
// serves the kubelet's Registration service (pluginregistration/v1) on a
// unix socket in the registration directory, answers GetInfo from its
// config and records the NotifyRegistrationStatus calls it gets. It works
// in tests and in programs (examples/registrar). Safe for concurrent use.
type Registrar struct {
	cfg    RegistrarConfig
	path   string
	server *grpc.Server
	done   chan struct{}

	mu       sync.Mutex
	statuses []RegistrarStatus
	getInfos int
	changed  chan struct{} // closed and replaced on every change
}

// StartRegistrar creates the registration socket (replacing a stale file
// of the same name) and serves on it until Stop.
func StartRegistrar(cfg RegistrarConfig) (*Registrar, error) {
	if cfg.Dir == "" {
		return nil, errors.New("registrar: Dir is required")
	}
	if cfg.SocketName == "" {
		cfg.SocketName = cfg.DriverName + "-reg.sock"
		if cfg.DriverName == "" || strings.ContainsRune(cfg.DriverName, '/') || strings.HasPrefix(cfg.DriverName, ".") {
			return nil, fmt.Errorf("registrar: driver name %q is not a file name: set SocketName", cfg.DriverName)
		}
	}
	if len(cfg.Versions) == 0 {
		cfg.Versions = []string{"1.0.0"}
	}
	if cfg.Type == "" {
		cfg.Type = registerapi.CSIPlugin
	}
	r := &Registrar{
		cfg:     cfg,
		path:    filepath.Join(cfg.Dir, cfg.SocketName),
		server:  grpc.NewServer(),
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("registrar: removing stale socket: %w", err)
	}
	lis, err := net.Listen("unix", r.path)
	if err != nil {
		return nil, fmt.Errorf("registrar: %w", err)
	}
	registerapi.RegisterRegistrationServer(r.server, registrationServer{r: r})
	go func() {
		defer close(r.done)
		_ = r.server.Serve(lis)
	}()
	return r, nil
}

// SocketPath returns the registration socket's path.
func (r *Registrar) SocketPath() string { return r.path }

// registrationServer is the Registration service a Registrar serves.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	r *Registrar
}

// GetInfo answers from the Registrar's config and counts the call.
func (srv registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r := srv.r
	r.mu.Lock()
	r.getInfos++
	r.changedLocked()
	r.mu.Unlock()
	return &registerapi.PluginInfo{
		Type:              r.cfg.Type,
		Name:              r.cfg.DriverName,
		Endpoint:          r.cfg.Endpoint,
		SupportedVersions: r.cfg.Versions,
	}, nil
}

// NotifyRegistrationStatus records the status.
func (srv registrationServer) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r := srv.r
	r.mu.Lock()
	r.statuses = append(r.statuses, RegistrarStatus{Registered: s.GetPluginRegistered(), Error: s.GetError()})
	r.changedLocked()
	r.mu.Unlock()
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (r *Registrar) changedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Statuses returns the statuses received so far, oldest first.
func (r *Registrar) statusesSoFar() []RegistrarStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RegistrarStatus(nil), r.statuses...)
}

// GetInfoCalls returns how many GetInfo calls the registrar answered.
func (r *Registrar) GetInfoCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.getInfos
}

// WaitForStatus waits until the registrar has received n statuses and
// returns the nth (n >= 1), or ctx's error.
func (r *Registrar) WaitForStatus(ctx context.Context, n int) (RegistrarStatus, error) {
	if n < 1 {
		return RegistrarStatus{}, fmt.Errorf("registrar: WaitForStatus(%d): n must be at least 1", n)
	}
	for {
		r.mu.Lock()
		if len(r.statuses) >= n {
			s := r.statuses[n-1]
			r.mu.Unlock()
			return s, nil
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return RegistrarStatus{}, fmt.Errorf("registrar %s: waiting for status %d (have %d): %w",
				r.path, n, len(r.statusesSoFar()), ctx.Err())
		}
	}
}

// Stop stops serving and removes the socket. It is idempotent.
func (r *Registrar) Stop() {
	r.server.Stop()
	<-r.done
	_ = os.Remove(r.path)
}
