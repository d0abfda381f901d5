package apiaudit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const node = "system:node:node-1"

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

func TestCount(t *testing.T) {
	base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	from, to := base, base.Add(time.Minute)
	other := "system:node:node-2"
	lines := []string{
		// A watch: opened (counted), then ended (the same request).
		auditLine(t, "w1", "ResponseStarted", "watch", node, "configmaps", "", "/api/v1/namespaces/apps/configmaps?watch=true", base.Add(time.Second)),
		auditLine(t, "w1", "ResponseComplete", "watch", node, "configmaps", "", "/api/v1/namespaces/apps/configmaps?watch=true", base.Add(time.Second)),
		auditLine(t, "t1", "ResponseComplete", "create", node, "serviceaccounts", "token", "/api/v1/namespaces/apps/serviceaccounts/app/token", base.Add(2*time.Second)),
		auditLine(t, "t2", "ResponseComplete", "create", node, "serviceaccounts", "token", "/api/v1/namespaces/apps/serviceaccounts/app/token", base.Add(3*time.Second)),
		auditLine(t, "l1", "ResponseComplete", "update", node, "leases", "", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1", base.Add(4*time.Second)),
		auditLine(t, "d1", "ResponseComplete", "get", node, "", "", "/api?timeout=32s", base.Add(5*time.Second)),
		// Not counted: another user, a stage other than the response's,
		// before and at the window's end.
		auditLine(t, "o1", "ResponseComplete", "get", other, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(time.Second)),
		auditLine(t, "p1", "Panic", "get", node, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(time.Second)),
		auditLine(t, "b1", "ResponseComplete", "get", node, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base.Add(-time.Microsecond)),
		auditLine(t, "e1", "ResponseComplete", "get", node, "secrets", "", "/api/v1/namespaces/apps/secrets/s", to),
	}
	log := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(log, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Count(log, node, from, to)
	if err != nil {
		t.Fatal(err)
	}
	want := Counts{"watch configmaps": 1, "create serviceaccounts/token": 2, "update leases": 1, "get /api": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if n := got.Total(); n != 5 {
		t.Errorf("Total() = %d, want 5", n)
	}
	if n := got.Of("configmaps", "secrets", "serviceaccounts/token"); n != 3 {
		t.Errorf("Of(configmaps, secrets, serviceaccounts/token) = %d, want 3", n)
	}
	if _, err := Count(filepath.Join(t.TempDir(), "none"), node, from, to); err == nil {
		t.Error("Count of a missing log: no error")
	}
}

func TestCountUsers(t *testing.T) {
	base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	other := "system:node:node-2"
	lines := []string{
		auditLine(t, "g1", "ResponseComplete", "get", node, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base),
		auditLine(t, "g2", "ResponseComplete", "get", other, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base),
		auditLine(t, "g3", "ResponseComplete", "get", other, "configmaps", "", "/api/v1/namespaces/apps/configmaps/c", base),
		auditLine(t, "g4", "ResponseComplete", "get", other, "configmaps", "", "/api/v1/namespaces/apps/configmaps/c", base.Add(time.Minute)),
	}
	log := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(log, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := CountUsers(log, base, base.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Counts{node: {"get secrets": 1}, other: {"get secrets": 1, "get configmaps": 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

func TestOpenWatches(t *testing.T) {
	base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	other := "system:node:node-2"
	cms, secs := "/api/v1/namespaces/apps/configmaps?watch=true", "/api/v1/namespaces/apps/secrets?watch=true"
	lines := []string{
		// Open: started, not ended.
		auditLine(t, "w1", "ResponseStarted", "watch", node, "configmaps", "", cms, base),
		auditLine(t, "w2", "ResponseStarted", "watch", node, "configmaps", "", cms, base),
		auditLine(t, "w3", "ResponseStarted", "watch", other, "secrets", "", secs, base),
		// Ended: not open.
		auditLine(t, "w4", "ResponseStarted", "watch", node, "secrets", "", secs, base),
		auditLine(t, "w4", "ResponseComplete", "watch", node, "secrets", "", secs, base),
		// Not a watch.
		auditLine(t, "g1", "ResponseStarted", "get", node, "secrets", "", "/api/v1/namespaces/apps/secrets/s", base),
	}
	log := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(log, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := OpenWatches(log)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Counts{node: {"watch configmaps": 2}, other: {"watch secrets": 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("open watches (-want +got):\n%s", diff)
	}
	if _, err := OpenWatches(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("OpenWatches of a missing log: no error")
	}
}

func TestArgs(t *testing.T) {
	tests := []struct {
		name  string
		users []string
		want  string
	}{
		{"every user", nil, "rules:\n- level: Metadata\n- level: None\n"},
		{"some users", []string{node, "system:node:node-2"},
			"rules:\n- level: Metadata\n  users: [\"system:node:node-1\",\"system:node:node-2\"]\n- level: None\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			args, log, err := Args(dir, tt.users...)
			if err != nil {
				t.Fatal(err)
			}
			if log != filepath.Join(dir, "audit.log") {
				t.Errorf("log path %s, want %s", log, filepath.Join(dir, "audit.log"))
			}
			policyPath := filepath.Join(dir, "audit-policy.yaml")
			for _, want := range []string{"--audit-policy-file=" + policyPath, "--audit-log-path=" + log, "--audit-log-format=json"} {
				if !slices.Contains(args, want) {
					t.Errorf("args %v lack %s", args, want)
				}
			}
			data, err := os.ReadFile(policyPath)
			if err != nil {
				t.Fatal(err)
			}
			if _, rules, _ := strings.Cut(string(data), "omitStages: [\"RequestReceived\"]\n"); rules != tt.want {
				t.Errorf("policy rules:\n%s\nwant:\n%s", rules, tt.want)
			}
		})
	}
}
