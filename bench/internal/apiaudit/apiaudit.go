// Package apiaudit counts a client's requests to kube-apiserver from the
// server's own audit log, the neutral counter of nodevol's benchmarks: it
// sees every request whatever client library made it (the stock
// kubelet's, nodevol's). Args gives kube-apiserver the flags that write
// the log; Count reads it back.
package apiaudit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// policy logs requests at the Metadata level without the RequestReceived
// stage, so that a request has one event when it completes, and a watch
// one when it is opened (ResponseStarted) and one when it ends
// (ResponseComplete). %s is the rule's users line: empty, every user.
const policy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
%s- level: None
`

// Args writes the audit policy into dir and returns kube-apiserver's
// flags that log to dir/audit.log (json, one event a line, written as
// requests are served, never rotated during a run), and that path. With
// users, only their requests are logged (a benchmark that creates
// thousands of objects as admin keeps its log small); without, every
// request is.
func Args(dir string, users ...string) (args []string, logPath string, err error) {
	usersLine := ""
	if len(users) > 0 {
		quoted, err := json.Marshal(users)
		if err != nil {
			return nil, "", fmt.Errorf("audit policy users %v: %w", users, err)
		}
		usersLine = "  users: " + string(quoted) + "\n"
	}
	policyPath := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policyPath, fmt.Appendf(nil, policy, usersLine), 0o600); err != nil {
		return nil, "", fmt.Errorf("writing the audit policy: %w", err)
	}
	logPath = filepath.Join(dir, "audit.log")
	return []string{
		"--audit-policy-file=" + policyPath,
		"--audit-log-path=" + logPath,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--audit-log-maxsize=10000",
	}, logPath, nil
}

// event is the part of an audit.k8s.io/v1 Event that Count reads.
type event struct {
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
func (ev *event) resource() string {
	if ev.ObjectRef == nil || ev.ObjectRef.Resource == "" {
		path, _, _ := strings.Cut(ev.RequestURI, "?")
		return path
	}
	if ev.ObjectRef.Subresource != "" {
		return ev.ObjectRef.Resource + "/" + ev.ObjectRef.Subresource
	}
	return ev.ObjectRef.Resource
}

// Counts are the requests of one user in a time window, by "verb
// resource" (e.g. "get persistentvolumeclaims", "create
// serviceaccounts/token", "get /api").
type Counts map[string]int

// Total is the number of requests.
func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Of is the number of requests about any of resources, whatever the verb.
func (c Counts) Of(resources ...string) int {
	n := 0
	for key, v := range c {
		if _, res, _ := strings.Cut(key, " "); slices.Contains(resources, res) {
			n += v
		}
	}
	return n
}

// String lists the counts by "verb resource", sorted, one a line, for a log.
func (c Counts) String() string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(c)) {
		fmt.Fprintf(&sb, "  %5d  %s\n", c[k], k)
	}
	return sb.String()
}

// Count reads the audit log at logPath and counts the requests of user
// that the API server received in [from, to), each once (by auditID, at
// stage ResponseStarted or ResponseComplete, whichever comes first: a
// watch is one request when it is opened).
func Count(logPath, user string, from, to time.Time) (Counts, error) {
	all, err := CountUsers(logPath, from, to)
	if err != nil {
		return nil, err
	}
	if c, ok := all[user]; ok {
		return c, nil
	}
	return Counts{}, nil
}

// CountUsers is Count for every user at once, by user name: one pass over
// the log, for a benchmark with many nodes.
func CountUsers(logPath string, from, to time.Time) (map[string]Counts, error) {
	seen := map[string]bool{}
	out := map[string]Counts{}
	err := eachEvent(logPath, func(ev *event) {
		if seen[ev.AuditID] || (ev.Stage != "ResponseStarted" && ev.Stage != "ResponseComplete") {
			return
		}
		at := ev.RequestReceivedTimestamp.Time
		if at.Before(from) || !at.Before(to) {
			return
		}
		seen[ev.AuditID] = true
		c := out[ev.User.Username]
		if c == nil {
			c = Counts{}
			out[ev.User.Username] = c
		}
		c[ev.Verb+" "+ev.resource()]++
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachEvent calls f on each event of the audit log at logPath, in order.
func eachEvent(logPath string, f func(*event)) error {
	file, err := os.Open(logPath)
	if err != nil {
		return fmt.Errorf("reading the audit log: %w", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("audit log %s: %w", logPath, err)
		}
		f(&ev)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("audit log %s: %w", logPath, err)
	}
	return nil
}

// OpenWatches reads the audit log at logPath and counts, by user and
// "watch resource", the watches open when it was read: opened
// (ResponseStarted) and not yet ended (ResponseComplete), as the API
// server logs each stage when it happens.
func OpenWatches(logPath string) (map[string]Counts, error) {
	type watch struct{ user, key string }
	open := map[string]watch{}
	err := eachEvent(logPath, func(ev *event) {
		if ev.Verb != "watch" {
			return
		}
		switch ev.Stage {
		case "ResponseStarted":
			open[ev.AuditID] = watch{ev.User.Username, ev.Verb + " " + ev.resource()}
		case "ResponseComplete", "Panic":
			delete(open, ev.AuditID)
		}
	})
	if err != nil {
		return nil, err
	}
	out := map[string]Counts{}
	for _, w := range open {
		if out[w.user] == nil {
			out[w.user] = Counts{}
		}
		out[w.user][w.key]++
	}
	return out, nil
}
