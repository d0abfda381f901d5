package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/internal/kubelettest"
)

// nodeagent is the example node agent (examples/nodeagent, the
// production command), built with the tags the Makefile's
// nodeagent-static builds it with (NODEAGENT_TAGS): its memory is the
// shipped binary's.
var nodeagent = kubelettest.Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/nodeagent",
	Flags: []string{"-tags", "grpcnotrace"}}

func TestMain(m *testing.M) {
	code := m.Run()
	nodeagent.Remove()
	os.Exit(code)
}

// agent is a running node agent process.
type agent struct {
	node  string
	root  string
	base  string // http://addr of /metrics and /healthz
	pprof string // addr of /debug/pprof/, with -scale.heapprofile
	proc  *kubelettest.Process
}

// startAgent creates node's Node as the node (what the kubelet does when
// it registers) and starts the example node agent with the node's
// client certificate, with --cluster-informers if -scale.informers, with the
// cluster's CSI driver, its log in {scratch}/{node}/nodeagent.log; it
// sets started to when the Node had been created (the node's requests
// from then on are the agent's) and returns once /healthz says ok (the
// informer of the node's pods has synced).
func startAgent(b *testing.B, c *cluster, node string, started *time.Time) *agent {
	b.Helper()
	ctx := b.Context()
	dir := filepath.Join(c.scratch, node)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		b.Fatal(err)
	}
	cfg, err := c.env.NodeConfig(node)
	if err != nil {
		b.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "node.kubeconfig")
	if err := c.env.WriteKubeconfig(kubeconfig, cfg); err != nil {
		b.Fatal(err)
	}
	nodes := kubernetes.NewForConfigOrDie(cfg).CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating node %s as the node: %v", node, err)
	}
	*started = time.Now() // the agent's requests from here on
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	a := &agent{node: node, root: filepath.Join(dir, "root"), base: "http://" + addr}
	args := []string{agentBinary(b, node), "--kubeconfig", kubeconfig, "--node", node, "--root-dir", a.root,
		"--plugin-registration=false", "--http-endpoint", addr,
		"--driver", c.driver.DriverName() + "=" + c.driver.Endpoint()}
	if *scaleInf {
		args = append(args, "--cluster-informers")
	}
	var env []string
	if *scaleHeap != "" {
		if a.pprof, err = freeAddr(); err != nil {
			b.Fatal(err)
		}
		args = append(args, "--profiling-address", a.pprof)
		// Finer sampling than the default one in 512 KiB.
		env = []string{"GODEBUG=memprofilerate=4096"}
	}
	a.proc = kubelettest.StartProcessEnv(b, dir, "nodeagent", env, args)
	err = a.wait(ctx, "its /healthz ok", 2*time.Minute, func() bool {
		resp, err := http.Get(a.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		b.Fatal(err)
	}
	return a
}

// stop stops the agent (SIGTERM, killed after 30 s); it may be called
// more than once.
func (a *agent) stop() { _ = a.proc.Stop() }

// wait polls ready until it holds; it fails when the agent exits, ctx
// ends or timeout passes, naming the agent's log.
func (a *agent) wait(ctx context.Context, what string, timeout time.Duration, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := a.proc.WaitFor(ctx, what, ready); err != nil {
		return fmt.Errorf("node agent of %s: %w", a.node, err)
	}
	return nil
}

// metrics reads the named metrics (unlabelled samples) from the agent's
// /metrics.
func (a *agent) metrics(names ...string) (map[string]float64, error) {
	resp, err := http.Get(a.base + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("node agent of %s: /metrics: %w", a.node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("node agent of %s: /metrics: %s", a.node, resp.Status)
	}
	return parseMetrics(resp.Body, names...)
}

// parseMetrics reads the unlabelled samples of names from a Prometheus
// text exposition; a name without one is an error.
func parseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		for _, want := range names {
			if name == want {
				v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
				if err != nil {
					return nil, fmt.Errorf("metric %s: %w", name, err)
				}
				out[name] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no metric %s", n)
		}
	}
	return out, nil
}

// status reads the memory lines of the process's /proc/{pid}/status.
func (a *agent) status() (procStatus, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", a.proc.Pid()))
	if err != nil {
		return procStatus{}, fmt.Errorf("node agent of %s: %w", a.node, err)
	}
	defer f.Close()
	st, err := parseStatus(f)
	if err != nil {
		return procStatus{}, fmt.Errorf("node agent of %s: /proc/%d/status: %w", a.node, a.proc.Pid(), err)
	}
	return st, nil
}

// procStatus is a process's memory as /proc/{pid}/status gives it, in
// bytes: VmRSS is RssAnon (heap, stacks, the runtime's own) plus RssFile
// (the pages of the binary and other files it touched) plus RssShmem
// (shared memory; a binary on a tmpfs is counted there).
type procStatus struct {
	VmRSS, VmHWM, RssAnon, RssFile, RssShmem uint64
}

// parseStatus reads VmRSS, VmHWM, RssAnon, RssFile and RssShmem from a
// /proc/{pid}/status file; a missing one is an error.
func parseStatus(r io.Reader) (procStatus, error) {
	var st procStatus
	fields := map[string]*uint64{"VmRSS": &st.VmRSS, "VmHWM": &st.VmHWM, "RssAnon": &st.RssAnon,
		"RssFile": &st.RssFile, "RssShmem": &st.RssShmem}
	seen := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		dst := fields[name]
		if !ok || dst == nil {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return procStatus{}, fmt.Errorf("%s %q: %w", name, rest, err)
		}
		*dst = kb << 10
		seen++
	}
	if err := sc.Err(); err != nil {
		return procStatus{}, err
	}
	if seen != len(fields) {
		return procStatus{}, fmt.Errorf("%d of the %d lines VmRSS, VmHWM, RssAnon, RssFile and RssShmem", seen, len(fields))
	}
	return st, nil
}

// agentBinary is the binary node's agent runs: the one of -scale.agents
// whose turn it is (node-N takes the (N-1)th, modulo their number), or
// examples/nodeagent built from this tree.
func agentBinary(b *testing.B, node string) string {
	if *scaleAgents == "" {
		return nodeagent.Path(b)
	}
	bins := strings.Split(*scaleAgents, ",")
	n, err := strconv.Atoi(strings.TrimPrefix(node, "node-"))
	if err != nil || n < 1 {
		b.Fatalf("node %s: no sample number", node)
	}
	return bins[(n-1)%len(bins)]
}

// smaps copies the agent's /proc/{pid}/smaps (every mapping's resident
// pages) to path.
func (a *agent) smaps(path string) error {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", a.proc.Pid()))
	if err != nil {
		return fmt.Errorf("node agent of %s: %w", a.node, err)
	}
	return os.WriteFile(path, data, 0o644)
}

// heapProfile writes the agent's heap profile, after a GC, to path.
func (a *agent) heapProfile(path string) error {
	resp, err := http.Get("http://" + a.pprof + "/debug/pprof/heap?gc=1")
	if err != nil {
		return fmt.Errorf("node agent of %s: heap profile: %w", a.node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node agent of %s: heap profile: %s", a.node, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("node agent of %s: heap profile: %w", a.node, err)
	}
	return f.Close()
}

// freeAddr returns a 127.0.0.1 TCP address that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
