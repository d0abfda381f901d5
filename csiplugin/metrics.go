package csiplugin

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// callMetrics is the kubelet's csi_operations_seconds: the duration of every
// CSI call, by driver, method and gRPC status code.
type callMetrics struct {
	seconds *prometheus.HistogramVec
}

// newCallMetrics registers csi_operations_seconds with reg, or reuses the
// one already registered there (several registries may share reg). nil
// records nothing.
func newCallMetrics(reg prometheus.Registerer) *callMetrics {
	if reg == nil {
		return nil
	}
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "csi_operations_seconds",
		Help:    "Duration of CSI calls, by driver, method and gRPC status code.",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"driver_name", "method_name", "grpc_status_code", "migrated"})
	if err := reg.Register(h); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			klog.Background().Error(err, "Cannot register csi_operations_seconds; CSI calls are not measured")
			return nil
		}
		existing, ok := are.ExistingCollector.(*prometheus.HistogramVec)
		if !ok {
			return nil
		}
		h = existing
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
		m.seconds.WithLabelValues(driver, method, code, "false").Observe(time.Since(start).Seconds())
		return err
	}
}
