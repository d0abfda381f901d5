package agent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// TestServeHTTP: /healthz answers 200 "ok" when the check passes and 500
// with its reason when it fails; /metrics serves the registry.
func TestServeHTTP(t *testing.T) {
	for _, tt := range []struct {
		name     string
		check    error
		wantCode int
		wantBody string
	}{
		{name: "healthy", wantCode: http.StatusOK, wantBody: "ok"},
		{name: "unhealthy", check: errors.New("volume manager reconcile loop did not answer"), wantCode: http.StatusInternalServerError,
			wantBody: "volume manager reconcile loop did not answer\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, logged := loggingContext()
			reg := newRegistry()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nodevol_test_total", Help: "A counter of the test."})
			reg.MustRegister(c)
			c.Add(3)
			stop, err := serveHTTP(ctx, "127.0.0.1:0", reg, func(context.Context) error { return tt.check })
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			addr := loggedAddress(t, logged.String())
			code, body := get(t, "http://"+addr+"/healthz")
			if code != tt.wantCode || body != tt.wantBody {
				t.Errorf("/healthz = %d %q, want %d %q", code, body, tt.wantCode, tt.wantBody)
			}
			code, body = get(t, "http://"+addr+"/metrics")
			for _, want := range []string{"nodevol_test_total 3\n", "process_start_time_seconds ", "go_goroutines "} {
				if code != http.StatusOK || !strings.Contains(body, want) {
					t.Errorf("/metrics = %d, want 200 and %q in:\n%s", code, want, body)
				}
			}
		})
	}
}

// get returns the status code and body of a GET of url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestDefaultNodeName: --node's default is $NODE_NAME (the downward API's
// spec.nodeName in a DaemonSet), then the host name.
func TestDefaultNodeName(t *testing.T) {
	for _, tt := range []struct {
		name, env, host string
		hostErr         error
		want            string
	}{
		{name: "NODE_NAME first", env: "node-1", host: "nodeagent-x7k2p", want: "node-1"},
		{name: "then the host name", host: "worker-3", want: "worker-3"},
		{name: "neither", hostErr: errors.New("no host name"), want: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "NODE_NAME" {
					return tt.env
				}
				return ""
			}
			got := defaultNodeName(getenv, func() (string, error) { return tt.host, tt.hostErr })
			if got != tt.want {
				t.Errorf("defaultNodeName = %q, want %q", got, tt.want)
			}
		})
	}
}

// loggingContext returns a context whose logger writes each line's
// key-value pairs to the returned builder.
func loggingContext() (context.Context, *strings.Builder) {
	logged := &strings.Builder{}
	log := funcr.New(func(_, args string) { logged.WriteString(args + "\n") }, funcr.Options{})
	return klog.NewContext(context.Background(), log), logged
}

// loggedAddress is the address a server logged it listens on.
func loggedAddress(t *testing.T, logged string) string {
	t.Helper()
	m := regexp.MustCompile(`"address"="([^"]+)"`).FindStringSubmatch(logged)
	if m == nil {
		t.Fatalf("no address logged: %s", logged)
	}
	return m[1]
}
