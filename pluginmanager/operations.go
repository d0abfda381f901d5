package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// register asks the registrar at path who it is, has the handler for its
// type validate and register it, and tells the registrar the result.
func (m *Manager) register(ctx context.Context, path string, gen uint64) outcome {
	out := outcome{path: path, gen: gen}
	logger := klog.FromContext(ctx).WithValues("socketPath", path)
	conn, err := m.dial(path)
	if err != nil {
		out.err = fmt.Errorf("connecting to plugin registration socket %s: %w", path, err)
		return out
	}
	client := registerapi.NewRegistrationClient(conn)
	info, err := m.getInfo(ctx, client)
	if err != nil {
		_ = conn.Close()
		out.err = fmt.Errorf("GetInfo on plugin registration socket %s: %w", path, err)
		return out
	}
	plugin := PluginInfo{
		SocketPath: path,
		Type:       info.GetType(),
		Name:       info.GetName(),
		Endpoint:   info.GetEndpoint(),
		Versions:   info.GetSupportedVersions(),
	}
	if plugin.Endpoint == "" {
		plugin.Endpoint = path
	}
	logger = logger.WithValues("pluginType", plugin.Type, "pluginName", plugin.Name, "endpoint", plugin.Endpoint)
	ctx = klog.NewContext(ctx, logger)
	handler, err := m.registerWith(ctx, plugin)
	if err != nil {
		out.err = fmt.Errorf("plugin registration socket %s: %w", path, err)
		out.then = func() { m.notify(ctx, conn, err) }
		return out
	}
	plugin.RegisteredAt = m.opts.Clock.Now()
	out.plugin = &actualPlugin{gen: gen, info: plugin, handler: handler}
	logger.V(2).Info("Registered plugin", "versions", plugin.Versions)
	out.then = func() { m.notify(ctx, conn, nil) }
	return out
}

// registerWith picks the handler for the plugin's type and has it validate
// and register the plugin.
func (m *Manager) registerWith(ctx context.Context, p PluginInfo) (Handler, error) {
	handler := m.opts.Handlers[p.Type]
	if handler == nil {
		return nil, fmt.Errorf("no handler for plugin type %q (plugin %q)", p.Type, p.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.HandlerTimeout)
	defer cancel()
	if err := handler.ValidatePlugin(ctx, p.Name, p.Endpoint, p.Versions); err != nil {
		return nil, fmt.Errorf("plugin %q refused: %w", p.Name, err)
	}
	if err := handler.RegisterPlugin(ctx, p.Name, p.Endpoint, p.Versions); err != nil {
		return nil, fmt.Errorf("registering plugin %q: %w", p.Name, err)
	}
	return handler, nil
}

// dial returns a connection to a registration socket. It connects lazily;
// its reconnection backoff is short, since a registrar's socket can appear
// (bind) a moment before it accepts (listen), and the first attempt then
// fails.
func (m *Manager) dial(path string) (*grpc.ClientConn, error) {
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	return grpc.NewClient("passthrough:///plugin-registration",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  time.Millisecond,
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: m.opts.RPCTimeout,
		}))
}

// getInfo calls GetInfo, waiting for the connection within RPCTimeout.
func (m *Manager) getInfo(ctx context.Context, client registerapi.RegistrationClient) (*registerapi.PluginInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.RPCTimeout)
	defer cancel()
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	if info.GetType() == "" {
		return nil, errors.New("GetInfo answer has no plugin type")
	}
	return info, nil
}

// notify tells the registrar the result of its registration (regErr nil:
// registered) and closes the connection. A failure is logged only: it does not change the
// registration, and a registrar that has gone is deregistered anyway.
func (m *Manager) notify(ctx context.Context, conn *grpc.ClientConn, regErr error) {
	defer conn.Close()
	if ctx.Err() != nil {
		return // cancelled: the socket went or the manager stops
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: regErr == nil}
	if regErr != nil {
		status.Error = regErr.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.RPCTimeout)
	defer cancel()
	_, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, status)
	if err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "NotifyRegistrationStatus failed", "pluginRegistered", status.PluginRegistered)
	}
}

// deregister has the plugin's handler deregister it.
func (m *Manager) deregister(ctx context.Context, path string, a *actualPlugin) outcome {
	out := outcome{path: path, dereg: true, gen: a.gen}
	logger := klog.FromContext(ctx).WithValues("socketPath", path, "pluginType", a.info.Type,
		"pluginName", a.info.Name, "endpoint", a.info.Endpoint)
	ctx, cancel := context.WithTimeout(klog.NewContext(ctx, logger), m.opts.HandlerTimeout)
	defer cancel()
	if err := a.handler.DeRegisterPlugin(ctx, a.info.Name, a.info.Endpoint); err != nil {
		out.err = fmt.Errorf("deregistering plugin %q of socket %s: %w", a.info.Name, path, err)
		return out
	}
	logger.V(2).Info("Deregistered plugin")
	return out
}
