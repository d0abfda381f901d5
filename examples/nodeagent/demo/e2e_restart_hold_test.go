package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/roottest"
)

// These tests restart the node agent the hard way: the volume manager runs
// in a separate process (agent-fake, on a fake API server built from a
// file), next to the loop driver in another, with real ext4 volumes on loop
// devices and real bind mounts; the agent is killed with SIGKILL and started
// again on the same root. The loop driver writes one line per Node RPC to a
// call log (--call-log), from which the tests count what the restarted agent
// sent.
//
// Settling: no public API says that the volume manager has nothing in
// flight or queued, and the volume manager must not change for these tests.
// Every operation that touches a mount is a Node RPC of the driver (the
// CSIDriver says attachRequired: false, so nothing else runs), so the test
// waits, after the agent has reported its pods, until the call log and the
// mounts under the root have not changed for settleQuiet, bounded by
// settleMax. The teardowns these tests look for start within milliseconds
// of the restart's reconstruction (for the first test, before the pods are
// even mounted again; for the second, whose agent has no pod to wait for
// and says READY before Run has read the disk, about 100 ms later, once
// the volume manager's informers have synced), far less than settleQuiet;
// retries after a failed call back off 500 ms, 1 s, 2 s..., and the counts
// are checked whether or not the agent settled.
const (
	settleQuiet = 2 * time.Second
	settleMax   = 20 * time.Second
)

// TestRestartRunningPodsKeepMounts: an agent that restarts, adds its
// running pods again and calls MarkPodsSynced at once (as the node agent
// does once its pod informer has synced) must not tear down those pods'
// volumes: no NodeUnpublishVolume, no NodeUnstageVolume, the same mounts
// (mount IDs) as before the restart, the data in place. With nodevol's
// records of the completed stage and publish (same boot, mounts still
// there) no NodeStageVolume or NodePublishVolume is sent again either.
//
// Whether the volume manager's reconciler plans the volumes found on disk
// before its pod worker has put the re-added pods into the desired state is
// a race. The agent is put on the losing side of it as far as that can be
// done from outside: --pods-first holds the volume manager's informers
// until every pod has been added and MarkPodsSynced called (the hold has
// lifted before Run reconstructs and starts its workers), and the agent
// runs with GOMAXPROCS=1. So placed, on a busy 2-core machine, a single
// restart showed the teardown in 15 runs out of 15, and with -race in 29
// out of 35: the restart is done up to restarts times, until one shows it.
func TestRestartRunningPodsKeepMounts(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with real mounts: skipped with -short")
	}
	roottest.Require(t)
	const restarts = 5
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-hA-", 5)

	a := e.startAgent(e.withPods)
	a.expect(t, "READY", time.Minute)
	e.writeData(t)
	before := e.mountIDs(t, true)
	targets, handles := map[string]bool{}, map[string]bool{}
	for _, v := range e.vols {
		targets[v.target], handles[v.handle] = true, true
	}
	for r := 1; r <= restarts; r++ {
		a.kill()
		from := fileSize(t, e.callLog)
		a = e.startAgent(e.withPods, "--pods-first")
		a.expect(t, "READY", time.Minute)
		settled := e.settle(t)
		calls := readCalls(t, e.callLog, from)
		label := fmt.Sprintf("after restart %d of %d", r, restarts)
		logCalls(t, label, e.root, calls)

		var unpublished, unstaged, again []string
		for _, c := range calls {
			switch {
			case c.method == "NodeStageVolume" || c.method == "NodePublishVolume":
				// nodevol's records say these completed on this boot and
				// the mounts are there: nothing to call again.
				again = append(again, c.method+" "+c.volume)
			case c.method == "NodeUnpublishVolume" && targets[c.target]:
				unpublished = append(unpublished, rel(e.root, c.target))
			case c.method == "NodeUnstageVolume" && handles[c.volume]:
				unstaged = append(unstaged, c.volume)
			}
		}
		if len(unpublished) > 0 {
			t.Errorf("%s: %d NodeUnpublishVolume for wanted pods, want 0: %v", label, len(unpublished), unpublished)
		}
		if len(unstaged) > 0 {
			t.Errorf("%s: %d NodeUnstageVolume of wanted pods' volumes, want 0: %v", label, len(unstaged), unstaged)
		}
		if len(again) > 0 {
			t.Errorf("%s: %d calls repeated for volumes recorded as staged and published, want 0: %v", label, len(again), again)
		}
		e.compareMounts(t, label, before, e.mountIDs(t, false))
		e.checkData(t)
		if !settled {
			t.Errorf("%s: the agent did not settle: the call log or the mounts under %s still changed after %v", label, e.root, settleMax)
		}
		if t.Failed() {
			break
		}
	}

	a.send(t, "delete-all")
	a.expect(t, "UNMOUNTED", time.Minute)
	a.stop()
	e.drv.stop()
	assertClean(t, e.drv, e.root)
}

// TestRestartCorruptPodDataKeepsStaging: pod volume directories whose
// vol_data.json is corrupt are left alone after a restart, and so must be
// what they use: the restarted agent (no pods, MarkPodsSynced) must not
// send NodeUnstageVolume for volumes whose publish mounts are still there.
func TestRestartCorruptPodDataKeepsStaging(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end with real mounts: skipped with -short")
	}
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-hB-", 2)

	a := e.startAgent(e.withPods)
	a.expect(t, "READY", time.Minute)
	e.writeData(t)
	before := e.mountIDs(t, true)
	a.kill()
	for _, v := range e.vols {
		dir := filepath.Dir(v.target)
		if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		// Without nodevol's record too (a directory the kubelet made, or
		// both files lost): nothing tells which volume it is.
		rel, err := filepath.Rel(e.root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.root, ondisk.RecordFile(rel)), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	from := fileSize(t, e.callLog)
	a = e.startAgent(e.withoutPods)
	a.expect(t, "READY 0", time.Minute)
	settled := e.settle(t)
	a.send(t, "in-use") // logged: what the agent holds on to
	a.expect(t, "IN-USE", 10*time.Second)
	calls := readCalls(t, e.callLog, from)
	logCalls(t, "after restart", e.root, calls)

	handles := map[string]bool{}
	for _, v := range e.vols {
		handles[v.handle] = true
	}
	var unstaged []string
	for _, c := range calls {
		if c.method == "NodeUnstageVolume" && handles[c.volume] {
			unstaged = append(unstaged, c.volume)
		}
	}
	if len(unstaged) > 0 {
		t.Errorf("after restart: %d NodeUnstageVolume of volumes still published in pods with a corrupt vol_data.json, want 0: %v", len(unstaged), unstaged)
	}
	after := e.mountIDs(t, false)
	for _, v := range e.vols {
		for _, p := range []string{v.target, v.staging} {
			if after[p] == "" {
				t.Errorf("after restart: %s is no longer mounted (was mount %s)", rel(e.root, p), before[p])
			}
		}
	}
	e.checkData(t)
	if !settled {
		t.Errorf("after restart: the agent did not settle: the call log or the mounts under %s still changed after %v", e.root, settleMax)
	}

	// By hand, as an operator would: the agent cannot tell what these
	// directories are. Unpublish and unstage through the driver, then
	// remove the directories the agent left.
	a.kill()
	e.teardownByHand(t, ctx)
	e.drv.stop()
	assertClean(t, e.drv, e.root)
}

// holdEnv is one test's root, loop driver process, volumes and agent.
type holdEnv struct {
	t           *testing.T
	node        string
	root        string
	callLog     string
	drv         *demoDriver
	vols        []holdVolume
	objs        fakeObjects // the API objects, without pods
	withPods    string      // objects file with the pods
	withoutPods string      // the same without pods
	agent       *agentProc
	// wrote are the volumes (PV names) writeData or writeVolume wrote into.
	wrote map[string]bool
}

// holdVolume is one pod and its volume.
type holdVolume struct {
	pod             *v1.Pod
	pv, handle      string
	target, staging string // publish target and staging path (the kubelet's layout)
}

// newHoldEnv starts the loop driver as a separate process with a call log
// under a new short root, provisions n volumes through its controller
// service and writes the agent's objects files: n pods, one claim each.
// Everything is undone when t ends, whatever happened.
func newHoldEnv(t *testing.T, ctx context.Context, prefix string, n int) *holdEnv {
	t.Helper()
	const node = "node-1"
	// A short root (under /tmp, whatever $TMPDIR is): the driver's socket
	// path must fit in 108 bytes.
	root, err := csitest.ShortTempDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	e := &holdEnv{t: t, node: node, root: root, callLog: filepath.Join(root, "calls.log"), wrote: map[string]bool{}}
	t.Cleanup(e.cleanup)
	e.startDriver(ctx)

	client := fake.NewClientset()
	pods, err := provision(ctx, client, e.drv, n, node)
	if err != nil {
		t.Fatal(err)
	}
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvcs, err := client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods {
		claim := pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
		pvc, err := client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		handle := pv.Spec.CSI.VolumeHandle
		sum := sha256.Sum256([]byte(handle))
		e.vols = append(e.vols, holdVolume{
			pod: pod, pv: pv.Name, handle: handle,
			target:  filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pv.Name, "mount"),
			staging: filepath.Join(root, "plugins", "kubernetes.io", "csi", e.drv.name, hex.EncodeToString(sum[:]), "globalmount"),
		})
	}
	e.objs = fakeObjects{
		CSIDrivers:             []storagev1.CSIDriver{*csitest.CSIDriver(e.drv.name, csitest.CSIDriverSpec{})},
		PersistentVolumes:      pvs.Items,
		PersistentVolumeClaims: pvcs.Items,
	}
	e.withoutPods = e.writeObjects(t, "objects-nopods.json", e.objs)
	e.withPods = e.objectsWith(t, "objects.json", e.vols)
	return e
}

// startDriver starts the loop driver process on the root's socket, state
// directory and call log, with faults (--fault values) if any.
func (e *holdEnv) startDriver(ctx context.Context, faults ...string) {
	t := e.t
	t.Helper()
	sock := filepath.Join(e.root, "plugins", driver.DefaultDriverName, "csi.sock")
	args := []string{loopDriverCommand,
		"--endpoint", "unix://" + sock, "--nodeid", e.node, "--statedir", filepath.Join(e.root, "loopdriver"),
		"--drivername", driver.DefaultDriverName, "--call-log", e.callLog}
	for _, f := range faults {
		args = append(args, "--fault="+f)
	}
	p, err := startSelf(ctx, filepath.Join(e.root, "loopdriver.log"), sock, args...)
	if err != nil {
		t.Fatalf("the loop driver: %v", err)
	}
	e.drv = &demoDriver{name: driver.DefaultDriverName, endpoint: sock, mounter: mount.New(""), real: true, stop: p.stop, kill: p.kill, exited: p.exited}
}

// restartDriver stops the loop driver (SIGTERM) if it still runs and
// starts it again on the same socket and state directory, with faults if
// any. The agent keeps its connection and must reconnect.
func (e *holdEnv) restartDriver(ctx context.Context, faults ...string) {
	e.t.Helper()
	e.drv.stop()
	e.startDriver(ctx, faults...)
}

// objectsWith writes an objects file with the API objects and the pods
// of vols.
func (e *holdEnv) objectsWith(t *testing.T, name string, vols []holdVolume) string {
	t.Helper()
	objs := e.objs
	objs.Pods = nil
	for _, v := range vols {
		objs.Pods = append(objs.Pods, *v.pod)
	}
	return e.writeObjects(t, name, objs)
}

func (e *holdEnv) writeObjects(t *testing.T, name string, objs fakeObjects) string {
	t.Helper()
	data, err := json.Marshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.root, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeData writes a file into each pod's volume, as its container would.
func (e *holdEnv) writeData(t *testing.T) {
	t.Helper()
	for _, v := range e.vols {
		e.writeVolume(t, v)
	}
}

// writeVolume writes volumeData into the pod's volume.
func (e *holdEnv) writeVolume(t *testing.T, v holdVolume) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(v.target, "hello.txt"), []byte(volumeData(v)), 0o644); err != nil {
		t.Fatalf("pod %s: writing into its volume: %v", v.pod.Name, err)
	}
	e.wrote[v.pv] = true
}

// volumeData is what writeVolume writes: it names the volume (its PV),
// not the pod, so that every pod of the claim reads the same.
func volumeData(v holdVolume) string { return "hello from " + v.pv + "\n" }

// checkData reads back what writeData wrote.
func (e *holdEnv) checkData(t *testing.T) {
	t.Helper()
	for _, v := range e.vols {
		want := volumeData(v)
		if got, err := os.ReadFile(filepath.Join(v.target, "hello.txt")); err != nil || string(got) != want {
			t.Errorf("pod %s: data after restart: %q, %v; want %q", v.pod.Name, got, err, want)
		}
	}
}

// mountIDs returns the identity of every mount point under the root: its
// mount IDs (field 1 of /proc/self/mountinfo, comma separated if stacked)
// and, for the top mount, the kernel's unique 64-bit mount ID (statx
// STATX_MNT_ID_UNIQUE, Linux 6.8+) where there is one: the kernel reuses
// the first kind at once, so a mount replaced by a new one can show the
// same field 1. With complete, each pod's publish target and staging path
// must be mounted.
func (e *holdEnv) mountIDs(t *testing.T, complete bool) map[string]string {
	t.Helper()
	ids := mountInfoUnder(t, e.root)
	for p, id := range ids {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &st); err == nil && st.Mask&unix.STATX_MNT_ID_UNIQUE != 0 {
			ids[p] = fmt.Sprintf("%s (unique %d)", id, st.Mnt_id)
		}
	}
	if complete {
		for _, v := range e.vols {
			for _, p := range []string{v.target, v.staging} {
				if ids[p] == "" {
					t.Fatalf("%s is not mounted; mounts under the root: %v", rel(e.root, p), ids)
				}
			}
		}
	}
	return ids
}

// compareMounts reports the publish and staging mounts that the restart
// replaced or removed.
func (e *holdEnv) compareMounts(t *testing.T, label string, before, after map[string]string) {
	t.Helper()
	e.compareVolumeMounts(t, label, e.vols, before, after)
}

// compareVolumeMounts is compareMounts for some of the volumes.
func (e *holdEnv) compareVolumeMounts(t *testing.T, label string, vols []holdVolume, before, after map[string]string) {
	t.Helper()
	for _, kind := range []string{"publish", "staging"} {
		var changed []string
		for _, v := range vols {
			p := v.target
			if kind == "staging" {
				p = v.staging
			}
			if after[p] != before[p] {
				changed = append(changed, fmt.Sprintf("%s: mount %s -> %q", rel(e.root, p), before[p], after[p]))
			}
		}
		if len(changed) > 0 {
			t.Errorf("%s: %d of %d %s mounts replaced (mount ID changed), want 0: %v", label, len(changed), len(vols), kind, changed)
		}
	}
}

// settle waits until the call log and the mounts under the root have not
// changed for settleQuiet, at most settleMax, and reports whether they
// settled (see the comment at the top).
func (e *holdEnv) settle(t *testing.T) bool {
	t.Helper()
	state := func() string {
		return fmt.Sprint(fileSize(t, e.callLog), mountInfoUnder(t, e.root))
	}
	last, since := state(), time.Now()
	for deadline := time.Now().Add(settleMax); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if s := state(); s != last {
			last, since = s, time.Now()
		} else if time.Since(since) >= settleQuiet {
			return true
		}
	}
	return false
}

// teardownByHand unpublishes and unstages the volumes through the driver
// and removes the directories the agent would have removed.
func (e *holdEnv) teardownByHand(t *testing.T, ctx context.Context) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+e.drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	for _, v := range e.vols {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.handle, TargetPath: v.target}); err != nil {
			t.Fatalf("unpublishing %s by hand: %v", rel(e.root, v.target), err)
		}
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.handle, StagingTargetPath: v.staging}); err != nil {
			t.Fatalf("unstaging %s by hand: %v", v.handle, err)
		}
		// os.Remove, never RemoveAll: these must be empty directories now.
		for _, p := range []string{
			v.target, filepath.Join(filepath.Dir(v.target), "vol_data.json"), filepath.Dir(v.target),
			v.staging, filepath.Join(filepath.Dir(v.staging), "vol_data.json"), filepath.Dir(v.staging),
		} {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				t.Errorf("removing %s by hand: %v", rel(e.root, p), err)
			}
		}
	}
}

// cleanup undoes whatever a test left, even when it failed half way: the
// agent killed, every mount under the root unmounted (deepest first), the
// driver stopped, its loop devices detached, the root removed.
func (e *holdEnv) cleanup() {
	t := e.t
	if e.agent != nil {
		e.agent.kill()
	}
	// A raw block volume's descriptor lock (a loop device on its map
	// file, a bind mount of the volume's device) goes first, as the
	// mapper takes it off: once the map file is lazily unmounted, the
	// lock's backing file is no longer under the root, and it would pin
	// the volume's own loop device for good.
	e.detachLoops()
	for range 3 {
		mps := mountPointsUnder(e.root)
		if len(mps) == 0 {
			break
		}
		t.Logf("cleanup: unmounting %v", mps)
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
	if e.drv != nil {
		e.drv.stop()
	}
	// A busy loop device is detached when its last user lets go, which
	// the kernel may finish a moment later.
	for range 20 {
		if e.detachLoops() == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if left := e.detachLoops(); left > 0 {
		t.Errorf("cleanup: %d loop devices on files under %s still attached", left, e.root)
	}
	// The agent and the driver are this test binary: built with -race,
	// they report a data race on stderr (their logs) and go on.
	for _, name := range []string{"agent.log", "loopdriver.log"} {
		if data, err := os.ReadFile(filepath.Join(e.root, name)); err == nil {
			if i := strings.Index(string(data), "WARNING: DATA RACE"); i >= 0 {
				t.Errorf("%s reports a data race:\n%s", name, string(data[i:min(len(data), i+4000)]))
			}
		}
	}
	if t.Failed() {
		for _, name := range []string{"agent.log", "loopdriver.log"} {
			if data, err := os.ReadFile(filepath.Join(e.root, name)); err == nil {
				t.Logf("%s (the end, without informer lines):\n%s", name, logTail(string(data), 6000))
			}
		}
	}
	if mps := mountPointsUnder(e.root); len(mps) > 0 {
		t.Errorf("cleanup: mounts still under %s, not removing it: %v", e.root, mps)
		return
	}
	if err := os.RemoveAll(e.root); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// detachLoops detaches every loop device whose backing file is under the
// root (a busy one is detached when its last user goes) and returns how
// many it found.
func (e *holdEnv) detachLoops() int {
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[1], e.root+"/") {
			e.t.Logf("cleanup: detaching %s (%s)", f[0], strings.Join(f[1:], " "))
			_ = exec.Command("losetup", "--detach", f[0]).Run()
			n++
		}
	}
	return n
}

// agentProc is a running agent-fake process.
type agentProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, closed when it exits
	done  chan struct{}
}

// startAgent runs agent-fake on the root with the objects file; its log
// goes to {root}/agent.log. It is killed if the test process dies.
func (e *holdEnv) startAgent(objects string, extra ...string) *agentProc {
	t := e.t
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.OpenFile(filepath.Join(e.root, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(self, fakeAgentCommand, "--root-dir", e.root, "--objects", objects,
		"--driver", e.drv.name+"="+e.drv.endpoint, "-v", "2")
	cmd.Args = append(cmd.Args, extra...)
	// One CPU, as for an agent in a pod with a CPU limit of 1 (Go sizes
	// GOMAXPROCS to it): goroutines run one at a time, which makes the
	// order of a restart far more regular than on the test's machine.
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, stdin: stdin, lines: make(chan string, 100), done: make(chan struct{})}
	e.agent = a
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			a.lines <- sc.Text()
		}
		close(a.lines)
		_ = cmd.Wait() // after the reads, as os/exec wants
		close(a.done)
	}()
	return a
}

// expect returns the agent's next stdout line that starts with prefix,
// failing on a FAILED line, on exit, or after timeout.
func (a *agentProc) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-a.lines:
			if !ok {
				t.Fatalf("agent exited while waiting for %q", prefix)
			}
			t.Logf("agent: %s", line)
			if strings.HasPrefix(line, "FAILED") {
				t.Fatalf("agent: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			t.Fatalf("agent: no %q within %v", prefix, timeout)
		}
	}
}

func (a *agentProc) send(t *testing.T, command string) {
	t.Helper()
	if _, err := io.WriteString(a.stdin, command+"\n"); err != nil {
		t.Fatalf("agent: sending %q: %v", command, err)
	}
}

// kill ends the agent with SIGKILL, as a crash, and waits for it.
func (a *agentProc) kill() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	a.wait()
}

// stop closes the agent's stdin, which ends it cleanly, and waits for it
// (SIGKILL after 15s).
func (a *agentProc) stop() {
	_ = a.stdin.Close()
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		a.kill()
	}
}

func (a *agentProc) wait() {
	lines := a.lines
	for {
		select {
		case _, ok := <-lines: // drain, so that the reader reaches EOF
			if !ok {
				lines = nil
			}
		case <-a.done:
			return
		}
	}
}

// call is one line of the loop driver's call log.
type call struct{ method, volume, target, staging string }

// readCalls returns the call log's lines from byte offset from.
func readCalls(t *testing.T, path string, from int64) []call {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	var calls []call
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			t.Fatalf("call log: bad line %q", sc.Text())
		}
		calls = append(calls, call{method: f[0], volume: f[1], target: f[2], staging: f[3]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// logCalls logs the calls and how many of each method there were.
func logCalls(t *testing.T, label, root string, calls []call) {
	t.Helper()
	counts := map[string]int{}
	var b strings.Builder
	for _, c := range calls {
		counts[c.method]++
		fmt.Fprintf(&b, "\n  %s %s %s %s", c.method, c.volume, rel(root, c.target), rel(root, c.staging))
	}
	t.Logf("%s: driver calls: %v%s", label, counts, b.String())
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// mountInfoUnder maps each mount point under root to its mount IDs, as
// /proc/self/mountinfo has them (comma separated when stacked).
func mountInfoUnder(t *testing.T, root string) map[string]string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			if out[f[4]] != "" {
				out[f[4]] += ","
			}
			out[f[4]] += f[0]
		}
	}
	return out
}

// mountPointsUnder lists the mount points under root (best effort, for cleanup).
func mountPointsUnder(root string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// rel shortens a path under root for messages.
func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// logTail returns about the last n bytes of a log, without the informers'
// chatter.
func logTail(s string, n int) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.Contains(line, "reflector.go") {
			b.WriteString(line)
		}
	}
	if out := b.String(); len(out) > n {
		return "..." + out[len(out)-n:]
	}
	return b.String()
}
