package kubeletbench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// auditLine is one audit event as kube-apiserver's json log writes it.
func auditLine(t *testing.T, id, stage, verb, user, resource, sub, uri string, at time.Time) string {
	t.Helper()
	ev := map[string]any{
		"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
		"auditID": id, "stage": stage, "verb": verb, "requestURI": uri,
		"user":                     map[string]any{"username": user, "groups": []string{"system:nodes"}},
		"requestReceivedTimestamp": at.UTC().Format("2006-01-02T15:04:05.000000Z"),
		"stageTimestamp":           at.UTC().Format("2006-01-02T15:04:05.000000Z"),
	}
	if resource != "" {
		ev["objectRef"] = map[string]any{"resource": resource, "subresource": sub, "namespace": "apps", "apiVersion": "v1"}
	}
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(data) + "\n"
}

func TestObjectsCountRequests(t *testing.T) {
	base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	from, to := base, base.Add(time.Minute)
	other := "system:node:node-2"
	lines := []string{
		// A watch: opened (counted), then ended (the same request).
		auditLine(t, "w1", "ResponseStarted", "watch", objUser, "configmaps", "", "/api/v1/namespaces/apps/configmaps?watch=true", base.Add(time.Second)),
		auditLine(t, "w1", "ResponseComplete", "watch", objUser, "configmaps", "", "/api/v1/namespaces/apps/configmaps?watch=true", base.Add(time.Second)),
		auditLine(t, "t1", "ResponseComplete", "create", objUser, "serviceaccounts", "token", "/api/v1/namespaces/apps/serviceaccounts/app/token", base.Add(2*time.Second)),
		auditLine(t, "t2", "ResponseComplete", "create", objUser, "serviceaccounts", "token", "/api/v1/namespaces/apps/serviceaccounts/app/token", base.Add(3*time.Second)),
		auditLine(t, "l1", "ResponseComplete", "update", objUser, "leases", "", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1", base.Add(4*time.Second)),
		auditLine(t, "d1", "ResponseComplete", "get", objUser, "", "", "/api?timeout=32s", base.Add(5*time.Second)),
		// Not counted: another user, a stage other than the response's,
		// before and at the window's end.
		auditLine(t, "o1", "ResponseComplete", "get", other, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(time.Second)),
		auditLine(t, "p1", "Panic", "get", objUser, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(time.Second)),
		auditLine(t, "b1", "ResponseComplete", "get", objUser, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(-time.Microsecond)),
		auditLine(t, "e1", "ResponseComplete", "get", objUser, "secrets", "", "/api/v1/namespaces/apps/secrets/s", to),
	}
	log := filepath.Join(t.TempDir(), "audit.log")
	var data string
	for _, l := range lines {
		data += l
	}
	if err := os.WriteFile(log, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := countRequests(log, objUser, from, to)
	if err != nil {
		t.Fatal(err)
	}
	want := requestCount{"watch configmaps": 1, "create serviceaccounts/token": 2, "update leases": 1, "get /api": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if all, volume := got.total(); all != 5 || volume != 3 {
		t.Errorf("total() = %d all, %d volume; want 5, 3", all, volume)
	}
}

func TestObjectsPercentileMs(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i
	}
	tests := []struct {
		name string
		d    []time.Duration
		q    float64
		want float64
	}{
		{"one", ms(7), 0.99, 7},
		{"median of an odd count, unsorted", ms(30, 10, 20), 0.5, 20},
		{"median of an even count: the lower", ms(40, 10, 30, 20), 0.5, 20},
		{"p99 of 100: the 99th", ms(hundred...), 0.99, 99},
		{"p99 of 50: the last", ms(hundred[50:]...), 0.99, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentileMs(tt.d, tt.q); got != tt.want {
				t.Errorf("percentileMs = %v, want %v", got, tt.want)
			}
		})
	}
	if got := percentileMs(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("percentileMs(nil) = %v, want NaN", got)
	}
}
