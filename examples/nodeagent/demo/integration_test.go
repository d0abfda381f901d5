package main

// Integration tests of the real node agent (main, with --kubeconfig)
// against a real kube-apiserver and etcd (package testenv), with the loop
// driver and the registrar as separate processes and real mounts. The
// agent authenticates as a user whose only rights are those of
// deploy/rbac.yaml.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/testenv"
)

// agentMainEnv, set to "1" in the environment of this test binary, makes
// it run main: the nodeagent command with its own command line.
const agentMainEnv = "NODEVOL_TEST_RUN_NODEAGENT"

// The identity the agent runs as: a token user in the group that
// deploy/rbac.yaml binds, and in no other.
const (
	agentUser  = "nodevol-agent-test"
	agentGroup = "nodevol-agents"
)

// rbacFile is the agent's RBAC, as shipped.
const rbacFile = "../../../deploy/rbac.yaml"

// TestIntegrationNodeAgent runs the nodeagent command against a real API
// server as a user bound only to deploy/rbac.yaml's ClusterRole, with
// plugin registration and volumes-in-use reporting on, the loop driver and
// the registrar as separate processes:
//
//   - Registration: the Node's csi.volume.kubernetes.io/nodeid annotation
//     and the CSINode are written through the API, while another client
//     keeps updating the Node's labels (conflicts are retried: no failed
//     registration in the agent's log).
//   - Pods created through the API mount (real ext4 on loop devices) and
//     are listed in the Node's status.volumesInUse; data written reads
//     back.
//   - kube-apiserver stopped and started again: the mounts stay (same
//     mount IDs, no NodeUnpublishVolume or NodeUnstageVolume), and a pod
//     created as soon as the server is back, while the agent's informers
//     are still recovering, mounts.
//   - Pods deleted (grace period 0): everything unmounts and the node is
//     exactly clean (the fault tests' invariant with nothing wanted);
//     volumesInUse empties. No request of the agent was forbidden, but for
//     the moment right after the restart when the new kube-apiserver's
//     RBAC authorizer has not yet read the bindings (watches refused once,
//     then retried).
func TestIntegrationNodeAgent(t *testing.T) {
	roottest.Require(t)
	api := testenv.StartT(t, testenv.Options{Users: []testenv.User{{Name: agentUser, Groups: []string{agentGroup}}}})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config())
	e := newHoldEnv(t, ctx, "nv-int-", 3)

	applyRBAC(t, ctx, admin, rbacFile)
	mustCreate(t, "namespace", func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, "node", func() error {
		_, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}}, metav1.CreateOptions{})
		return err
	})
	createVolumeObjects(t, ctx, admin, e)
	kubeconfig := writeAgentKubeconfig(t, ctx, api, filepath.Join(e.root, "kubeconfig"))

	// Another writer of the Node, as the kubelet's status updates and
	// label controllers are on a real cluster.
	writerCtx, stopWriter := context.WithCancel(ctx)
	var writes, conflicts atomic.Int64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		nodeWriter(writerCtx, admin, e.node, &writes, &conflicts)
	}()
	defer func() { stopWriter(); <-writerDone }()

	agent := startRealAgent(t, e.root, kubeconfig, e.node)
	registrar, err := startDemoRegistrar(ctx, e.root, e.drv)
	if err != nil {
		t.Fatal(err)
	}
	defer registrar.stop()
	start := time.Now()
	eventually(t, ctx, "the driver recorded on the Node and CSINode", func() (bool, error) {
		return recordedThroughAPI(ctx, admin, e.node, e.drv.name)
	})
	before := writes.Load()
	eventually(t, ctx, "the Node written again after the registration", func() (bool, error) { return writes.Load() > before, nil })
	stopWriter()
	<-writerDone
	t.Logf("registered after %v; meanwhile another client updated the Node %d times (%d conflicts)",
		time.Since(start).Round(time.Millisecond), writes.Load(), conflicts.Load())
	if agent.logContains(t, 0, "Plugin registration failed") {
		t.Errorf("a registration failed (agent.log):\n%s", agent.grep(t, 0, "Plugin registration failed"))
	}
	// The annotation is the agent's node ID and survived the label writes.
	n, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations[registration.NodeIDAnnotation]; got != `{"`+e.drv.name+`":"`+e.node+`"}` {
		t.Errorf("Node annotation %s = %q", registration.NodeIDAnnotation, got)
	}

	// Two pods mount, their volumes are reported in use as far as they
	// need attaching (waitVolumesInUse), data is written.
	first := e.vols[:2]
	for i := range first {
		createPodThroughAPI(t, ctx, admin, e, i)
	}
	if !waitInvariant(t, e, "two pods mounted", first) {
		t.FailNow()
	}
	for _, v := range first {
		e.writeVolume(t, v)
	}
	waitVolumesInUse(t, ctx, admin, e, first)

	// The API server goes away and comes back.
	mounts := e.mountIDs(t, false)
	calls := fileSize(t, e.callLog)
	// StopAPIServer returns once the process has exited: the agent's
	// connections (its watches) are gone, and its reconnects are refused
	// until StartAPIServer has the server ready again (seconds). client-go
	// retries a refused watch quietly, so the agent's log does not say so.
	if agent.logContains(t, 0, "forbidden") {
		t.Errorf("the agent was refused something with deploy/rbac.yaml's rights:\n%s", agent.grep(t, 0, "forbidden"))
	}
	// Up to here the set-up is correct and nothing failed: the agent's
	// log has no line at warning or error level.
	if bad := agent.warningsAndErrors(t); bad != "" {
		t.Errorf("the agent logged warnings or errors on a correct set-up:\n%s", bad)
	}
	api.StopAPIServer()
	if _, err := admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{}); err == nil {
		t.Fatal("the API answered while stopped")
	}
	if err := api.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	createPodThroughAPI(t, ctx, admin, e, 2)
	if !waitInvariant(t, e, "after the API server restart, three pods mounted", e.vols) {
		t.FailNow()
	}
	t.Logf("the pod created right after the restart mounted within %v", time.Since(back).Round(time.Millisecond))
	e.writeVolume(t, e.vols[2])
	e.compareVolumeMounts(t, "API server restart", first, mounts, e.mountIDs(t, false))
	since := readCalls(t, e.callLog, calls)
	for _, v := range first {
		if n := teardownCalls(since, &v); n != 0 {
			t.Errorf("pod %s: %d NodeUnpublishVolume/NodeUnstageVolume calls across the API server restart, want 0", v.pod.Name, n)
		}
	}
	waitVolumesInUse(t, ctx, admin, e, e.vols)
	if !e.settle(t) {
		t.Errorf("the agent did not settle after the restart")
	}
	checkInvariant(t, e, "settled after the API server restart", e.vols)
	// A kube-apiserver just started may refuse requests for a moment
	// (its RBAC authorizer has not yet read the roles and bindings from
	// etcd): the agent's watches may log "forbidden" then, and retry.
	// From here on nothing may be refused.
	settled := fileSize(t, agent.log)

	// Every pod goes: exactly clean.
	for _, v := range e.vols {
		if err := admin.CoreV1().Pods(v.pod.Namespace).Delete(ctx, v.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	waitInvariant(t, e, "every pod deleted", nil)
	waitVolumesInUse(t, ctx, admin, e, nil)
	if agent.logContains(t, settled, "forbidden") {
		t.Errorf("the agent was refused something with deploy/rbac.yaml's rights:\n%s", agent.grep(t, settled, "forbidden"))
	}
	if err := agent.stop(); err != nil {
		t.Errorf("agent: %v", err)
	}
}

// TestIntegrationNodeAgentMissingRule: with one rule of deploy/rbac.yaml
// taken away (watch csidrivers, which an informer reads in every mode;
// claims are read one at a time, with get only), the agent says in its log
// which verb on which resource it was refused, and as whom. The rule taken
// is watch, not list: from 1.37 on, client-go's informers list through a
// watch stream (WatchListClient, served by the 1.37 API server), so an
// agent without list is never refused; it still needs list against an API
// server that cannot stream the list, where client-go falls back to it.
func TestIntegrationNodeAgentMissingRule(t *testing.T) {
	api := testenv.StartT(t, testenv.Options{Users: []testenv.User{{Name: agentUser, Groups: []string{agentGroup}}}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config())
	applyRBAC(t, ctx, admin, rbacFile)
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, "nodevol-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	for i, r := range role.Rules {
		if slices.Contains(r.Resources, "csidrivers") && slices.Contains(r.Verbs, "watch") {
			// csidrivers loses watch; the rule's other resources keep it.
			others := slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == "csidrivers" })
			role.Rules[i].Resources = []string{"csidrivers"}
			role.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(s string) bool { return s == "watch" })
			if len(others) > 0 {
				role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: r.APIGroups, Resources: others, Verbs: r.Verbs})
			}
			removed = true
			break
		}
	}
	if !removed {
		t.Fatalf("%s has no rule that lets the agent watch csidrivers", rbacFile)
	}
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, "node", func() error {
		_, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
		return err
	})
	root := t.TempDir()
	kubeconfig := writeAgentKubeconfig(t, ctx, api, filepath.Join(root, "kubeconfig"))
	agent := startRealAgent(t, root, kubeconfig, "node-1")
	want := `User "` + agentUser + `" cannot watch resource "csidrivers"`
	eventually(t, ctx, "the agent to log that watching CSIDrivers is forbidden", func() (bool, error) {
		return agent.logContains(t, 0, want), nil
	})
	t.Logf("agent.log: %s", agent.grep(t, 0, want))
	// Only that: pods, claims, PVs and VolumeAttachments are read.
	for _, ok := range []string{"pods", "persistentvolumeclaims", "persistentvolumes", "volumeattachments"} {
		for _, verb := range []string{"list", "watch"} {
			if agent.logContains(t, 0, `cannot `+verb+` resource "`+ok+`"`) {
				t.Errorf("the agent was refused to %s %s, which the role allows", verb, ok)
			}
		}
	}
	if err := agent.stop(); err != nil {
		t.Errorf("agent: %v", err)
	}
}

func mustCreate(t *testing.T, what string, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
}

// applyRBAC creates every object of the YAML file path (ClusterRoles and
// ClusterRoleBindings) through client.
func applyRBAC(t *testing.T, ctx context.Context, client kubernetes.Interface, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	decoder := scheme.Codecs.UniversalDeserializer()
	created := 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: decoding a document: %v", path, err)
		}
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %v", path, gvk)
		}
		if err != nil {
			t.Fatalf("%s: creating %v: %v", path, gvk, err)
		}
		created++
	}
	if created != 2 {
		t.Fatalf("%s: %d objects, want a ClusterRole and a ClusterRoleBinding", path, created)
	}
}

// writeAgentKubeconfig writes a kubeconfig file for agentUser's token and
// waits until RBAC lets that user list pods (the authorizer's cache sees a
// new binding a moment after it is created).
func writeAgentKubeconfig(t *testing.T, ctx context.Context, api *testenv.Env, path string) string {
	t.Helper()
	cfg, err := api.TokenConfig(agentUser)
	if err != nil {
		t.Fatal(err)
	}
	if err := api.WriteKubeconfig(path, cfg); err != nil {
		t.Fatal(err)
	}
	loaded, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(loaded)
	eventually(t, ctx, "RBAC to let "+agentUser+" list pods", func() (bool, error) {
		_, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	return path
}

// createVolumeObjects creates e's CSIDriver, and each of its PVCs with the
// PV it names, bound as the PV controller leaves them, through the API.
func createVolumeObjects(t *testing.T, ctx context.Context, client kubernetes.Interface, e *holdEnv) {
	t.Helper()
	for _, d := range e.objs.CSIDrivers {
		d.ResourceVersion, d.UID = "", ""
		if _, err := client.StorageV1().CSIDrivers().Create(ctx, &d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pvs := map[string]*v1.PersistentVolume{}
	for i := range e.objs.PersistentVolumes {
		pvs[e.objs.PersistentVolumes[i].Name] = &e.objs.PersistentVolumes[i]
	}
	for i := range e.objs.PersistentVolumeClaims {
		pvc := &e.objs.PersistentVolumeClaims[i]
		pv, ok := pvs[pvc.Spec.VolumeName]
		if !ok {
			t.Fatalf("claim %s/%s names PV %q, which the objects lack", pvc.Namespace, pvc.Name, pvc.Spec.VolumeName)
		}
		if _, _, err := csitest.CreateBound(ctx, client, pvc, pv); err != nil {
			t.Fatal(err)
		}
		delete(pvs, pv.Name)
	}
	if len(pvs) > 0 {
		t.Fatalf("PVs of no claim: %v", slices.Sorted(maps.Keys(pvs)))
	}
}

// createPodThroughAPI creates the pod of e.vols[i] through the API and
// takes the server's UID into the volume's pod and publish target.
func createPodThroughAPI(t *testing.T, ctx context.Context, client kubernetes.Interface, e *holdEnv, i int) {
	t.Helper()
	v := &e.vols[i]
	pod := v.pod.DeepCopy()
	pod.UID, pod.ResourceVersion = "", ""
	created, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.pod = created
	v.target = filepath.Join(e.root, "pods", string(created.UID), "volumes", "kubernetes.io~csi", v.pv, "mount")
}

// waitVolumesInUse waits until the Node's status.volumesInUse lists
// exactly the volumes of vols that need attaching: as the kubelet's, it
// lists none of a driver whose CSIDriver says attachRequired: false (the
// loop driver's here).
func waitVolumesInUse(t *testing.T, ctx context.Context, client kubernetes.Interface, e *holdEnv, vols []holdVolume) {
	t.Helper()
	attach := true // no CSIDriver: the kubelet attaches
	for _, d := range e.objs.CSIDrivers {
		if d.Name == e.drv.name && d.Spec.AttachRequired != nil {
			attach = *d.Spec.AttachRequired
		}
	}
	var want []v1.UniqueVolumeName
	for _, v := range vols {
		if attach {
			want = append(want, v1.UniqueVolumeName(podvol.CSIVolumeName(e.drv.name, v.handle)))
		}
	}
	slices.Sort(want)
	var got []v1.UniqueVolumeName
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	eventually(t, ctx, "the Node's volumesInUse", func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return false, nil // the server may be coming back
		}
		got = slices.Sorted(slices.Values(n.Status.VolumesInUse))
		return slices.Equal(got, want), nil
	})
}

// recordedThroughAPI reports whether the Node's node ID annotation and the
// CSINode both list driver.
func recordedThroughAPI(ctx context.Context, client kubernetes.Interface, node, driver string) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	ids := map[string]string{}
	if a, ok := n.Annotations[registration.NodeIDAnnotation]; ok {
		if err := json.Unmarshal([]byte(a), &ids); err != nil {
			return false, err
		}
	}
	if _, ok := ids[driver]; !ok {
		return false, nil
	}
	cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver }), nil
}

// nodeWriter updates a label of the Node again and again (get, change,
// update) until ctx ends, counting the updates and the conflicts.
func nodeWriter(ctx context.Context, client kubernetes.Interface, node string, writes, conflicts *atomic.Int64) {
	for i := 0; ctx.Err() == nil; i++ {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			continue
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["nodevol.io/writer"] = strconv.Itoa(i)
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		switch {
		case err == nil:
			writes.Add(1)
		case apierrors.IsConflict(err):
			conflicts.Add(1)
		}
	}
}

// realAgent is the nodeagent command running as a separate process.
type realAgent struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set before done is closed
}

// startRealAgent runs the nodeagent command (this test binary, as main)
// with --kubeconfig on root, plugin registration and volumes-in-use
// reporting on (its defaults), its log appended to {root}/agent.log. It is
// killed when the test ends or the test process dies.
func startRealAgent(t *testing.T, root, kubeconfig, node string, extraArgs ...string) *realAgent {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(root, "agent.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	args := append([]string{"--kubeconfig", kubeconfig, "--node", node, "--root-dir", root,
		"--plugin-registration=true", "--report-volumes-in-use=true", "-v", "2"}, extraArgs...)
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), agentMainEnv+"=1")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &realAgent{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { a.err = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-a.done
		if data, err := os.ReadFile(logPath); err == nil {
			if i := bytes.Index(data, []byte("WARNING: DATA RACE")); i >= 0 {
				t.Errorf("agent.log reports a data race:\n%s", data[i:min(len(data), i+4000)])
			}
			if t.Failed() {
				t.Logf("agent.log (the end):\n%s", logTail(string(data), 6000))
			}
		}
	})
	return a
}

// stop ends the agent with SIGTERM, as a node shutdown, and returns its
// exit error (nil for a clean exit); SIGKILL after 15 s.
func (a *realAgent) stop() error {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
		return a.err
	case <-time.After(15 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		return errors.New("did not exit within 15s of SIGTERM")
	}
}

// logContains reports whether the agent's log, from byte offset from on,
// has s, with the quotes that klog escapes inside its structured values
// (err="... \"x\" ...") unescaped.
func (a *realAgent) logContains(t *testing.T, from int64, s string) bool {
	t.Helper()
	return strings.Contains(a.readLog(t, from), s)
}

// readLog returns the agent's log from byte offset from on, with klog's
// escaped quotes unescaped.
func (a *realAgent) readLog(t *testing.T, from int64) string {
	t.Helper()
	data, err := os.ReadFile(a.log)
	if err != nil {
		t.Fatal(err)
	}
	if from > int64(len(data)) {
		from = int64(len(data))
	}
	return strings.ReplaceAll(string(data[from:]), `\"`, `"`)
}

// grep returns the log's lines from byte offset from on that contain s
// (at most 10).
func (a *realAgent) grep(t *testing.T, from int64, s string) string {
	t.Helper()
	var out []string
	for line := range strings.Lines(a.readLog(t, from)) {
		if strings.Contains(line, s) && len(out) < 10 {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// warningsAndErrors returns the agent's log lines at warning or error level
// (klog's W and E headers), at most 10.
func (a *realAgent) warningsAndErrors(t *testing.T) string {
	t.Helper()
	var out []string
	for line := range strings.Lines(a.readLog(t, 0)) {
		if (strings.HasPrefix(line, "W") || strings.HasPrefix(line, "E")) && len(line) > 5 && strings.Trim(line[1:5], "0123456789") == "" && len(out) < 10 {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
