package kubeletbench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The API server's audit log is the neutral counter of BenchmarkPodObjects:
// it sees the kubelet's requests and nodevol's alike, whatever client
// library made them. The policy logs every request at the Metadata level,
// without the RequestReceived stage, so that a request has one event when
// it completes, and a watch one when it is opened (ResponseStarted) and one
// when it ends (ResponseComplete); a request is counted once, by its
// auditID.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// auditArgs writes the policy into dir and returns kube-apiserver's flags
// that log to dir/audit.log (json, one event a line, written as requests
// are served, never rotated during a run), and that path.
func auditArgs(dir string) ([]string, string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, "", fmt.Errorf("writing the audit policy: %w", err)
	}
	log := filepath.Join(dir, "audit.log")
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + log,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--audit-log-maxsize=10000",
	}, log, nil
}

// auditEvent is the part of an audit.k8s.io/v1 Event that the counting reads.
type auditEvent struct {
	AuditID string `json:"auditID"`
	Stage   string `json:"stage"`
	Verb    string `json:"verb"`
	User    struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestURI               string           `json:"requestURI"`
	RequestReceivedTimestamp metav1.MicroTime `json:"requestReceivedTimestamp"`
}

// resource names the event's resource as "resource" or
// "resource/subresource"; a request that is not about a resource (a
// discovery GET) is named by its path.
func (ev *auditEvent) resource() string {
	if ev.ObjectRef == nil || ev.ObjectRef.Resource == "" {
		path, _, _ := strings.Cut(ev.RequestURI, "?")
		return path
	}
	if ev.ObjectRef.Subresource != "" {
		return ev.ObjectRef.Resource + "/" + ev.ObjectRef.Subresource
	}
	return ev.ObjectRef.Resource
}

// volumeResources are the resources a node reads or asks for because of
// its pods' configMap, secret and projected volumes: the objects (watched
// or read one by one) and the service-account tokens (TokenRequest).
var volumeResources = []string{"configmaps", "secrets", "serviceaccounts/token"}

// requestCount is the requests of one user in a time window, by "verb
// resource".
type requestCount map[string]int

// total is every request; volume only those of volumeResources.
func (c requestCount) total() (all, volume int) {
	for key, n := range c {
		all += n
		_, res, _ := strings.Cut(key, " ")
		if slices.Contains(volumeResources, res) {
			volume += n
		}
	}
	return all, volume
}

// String lists the counts by "verb resource", sorted, for the log.
func (c requestCount) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %5d  %s\n", c[k], k)
	}
	return sb.String()
}

// countRequests reads the audit log and counts the requests of user that
// the API server received in [from, to), each once (by auditID, at stage
// ResponseStarted or ResponseComplete, whichever comes first: a watch is
// one request when it is opened).
func countRequests(auditLog, user string, from, to time.Time) (requestCount, error) {
	f, err := os.Open(auditLog)
	if err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	defer f.Close()
	seen := map[string]bool{}
	out := requestCount{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("audit log %s: %w", auditLog, err)
		}
		if ev.User.Username != user || seen[ev.AuditID] || (ev.Stage != "ResponseStarted" && ev.Stage != "ResponseComplete") {
			continue
		}
		at := ev.RequestReceivedTimestamp.Time
		if at.Before(from) || !at.Before(to) {
			continue
		}
		seen[ev.AuditID] = true
		out[ev.Verb+" "+ev.resource()]++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit log %s: %w", auditLog, err)
	}
	return out, nil
}
