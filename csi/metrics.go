package csi

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/promreg"
)

// callMetrics is the kubelet's csi_operations_seconds: the duration of every
// CSI call, by driver, method and gRPC status code.
type callMetrics struct {
	seconds observerVec
}

// observerVec is a histogram vector: prometheus's own, or one that wraps
// it (the kubelet's k8s.io/component-base HistogramVec).
type observerVec interface {
	prometheus.Collector
	GetMetricWithLabelValues(lvs ...string) (prometheus.Observer, error)
}

// newCallMetrics registers csi_operations_seconds with reg, or reuses the
// one already registered there (several registries may share reg). nil
// records nothing.
func newCallMetrics(reg prometheus.Registerer) *callMetrics {
	if reg == nil {
		return nil
	}
	// The kubelet's exact shape, help text included (k8s.io/component-base
	// prefixes its stability level): a registerer that already holds the
	// kubelet's own collector, or another registry's, shares it.
	h, err := promreg.Reuse[observerVec](reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "csi_operations_seconds",
		Help:    "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"driver_name", "method_name", "grpc_status_code", "migrated"}))
	if err != nil {
		klog.Background().Error(err, "Cannot register csi_operations_seconds; CSI calls are not measured")
		return nil
	}
	return &callMetrics{seconds: h}
}

// interceptor returns the unary interceptor that measures driver's calls.
func (m *callMetrics) interceptor(driver string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		code := "unknown-non-grpc"
		if s, ok := status.FromError(err); ok {
			code = s.Code().String()
		}
		if h, herr := m.seconds.GetMetricWithLabelValues(driver, method, code, "false"); herr == nil {
			h.Observe(time.Since(start).Seconds())
		}
		return err
	}
}
