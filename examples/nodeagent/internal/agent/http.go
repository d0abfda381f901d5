package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// healthzTimeout bounds one /healthz check when the prober's request has
// no shorter deadline: a reconcile loop that does not answer within it is
// stuck.
const healthzTimeout = 10 * time.Second

// newRegistry returns the registry /metrics serves: the volume manager's
// metrics (registered by volumemanager.New), and the process and Go
// runtime metrics that kubernetes-csi sidecars export too.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return reg
}

// serveHTTP listens on addr and serves /metrics from reg and /healthz from
// healthy (200 "ok", or 500 with the reason) until stop is called; stop
// waits for the requests being served. It logs the address it listens on
// (with ":0", the port chosen).
func serveHTTP(ctx context.Context, addr string, reg *prometheus.Registry, healthy func(context.Context) error) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-endpoint %s: %w", addr, err)
	}
	logger := klog.FromContext(ctx)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), healthzTimeout)
		defer cancel()
		if err := healthy(ctx); err != nil {
			logger.V(2).Info("Health check failed", "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return serveMux(ctx, ln, mux, "/metrics and /healthz"), nil
}

// serveMux serves mux on ln until stop is called, logging the address
// (what it serves, in the log); stop shuts the server down and
// waits for the requests being served.
func serveMux(ctx context.Context, ln net.Listener, mux *http.ServeMux, what string) (stop func()) {
	logger := klog.FromContext(ctx)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP server stopped", "serving", what, "address", ln.Addr().String())
		}
	}()
	logger.Info("Serving "+what, "address", ln.Addr().String())
	return func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		<-served
	}
}
