package volumemanager

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/internal/steptest"
	"github.com/nodevol/nodevol/step"
)

// The crash-point suite. Every change nodevol makes to a node (a directory,
// a file, a record, a symlink, a mount, a loop device, a CSI call) is a step
// that goes through Config.Steps (package step). For each scenario the
// suite counts the steps of its operation in a run without a crash, then,
// for every k, runs it again and stops at step k: that step and every one
// after it is refused, which leaves the disk, the mount table and the driver
// as a process killed at that instant would. It then drops the manager,
// starts a new one on the same disk, mount table and driver, adds the pods
// wanted by then (as acted, the other choice, or after a reboot), does what
// their containers do once their volumes are mounted (runContainers: files
// written, subPath mounts prepared), waits for the node to converge and
// checks one invariant: the node is exactly as a run without a crash
// leaves it (the driver's staged and published volumes, the mount table,
// the loop devices and every entry under the root, the files' contents
// where a volume's content is the operation's), and no
// NodeUnstageVolume was sent while a publish of the volume existed. The
// restart itself is crashed too: at every step of the recovering manager,
// followed by a third, clean one. Steps are found by counting, so a step
// added to the code is covered without touching this file.

// crashNode is what survives a process: the root directory, the mount
// table, the loop devices, the driver (its own process) and the API
// server; a reboot takes all but the disk and the API server.
type crashNode struct {
	t       *testing.T
	root    string
	boot    string
	mounter *mount.FakeMounter
	loops   *fakeLooper
	drv     *csitest.Server
	client  *fake.Clientset
	// handles maps each staging path to the volume handle staged there.
	handles map[string]string
	mu      sync.Mutex
	// violations are the unstages sent while a publish existed.
	violations []string
	boots      int
	// selfAttach runs the managers with Config.SelfAttach, informers
	// with Config.ClusterInformers.
	selfAttach, informers bool
	// nodeObj, if set, is Config.Node's answer.
	nodeObj *v1.Node
	// binds are the fake mounter's binds of opened files, volatile what a
	// reboot loses of what the pods wrote (crash_kinds_test.go).
	binds    fdBinds
	volatile map[string]bool
	readers  readers // what containers read at each step
}

func newCrashNode(t *testing.T, drv *csitest.Server, client *fake.Clientset) *crashNode {
	n := &crashNode{
		t: t, root: t.TempDir(), mounter: mount.NewFakeMounter(nil),
		loops: &fakeLooper{dev: map[string]string{}}, drv: drv, client: client,
		handles: map[string]string{}, volatile: map[string]bool{},
	}
	n.binds.files = map[string]bool{}
	n.mounter.UnmountFunc = n.binds.unbind
	n.boot = filepath.Join(t.TempDir(), "boot_id")
	n.reboot()
	return n
}

// reboot forgets the mounts, the loop devices, the driver's state and
// what the pods wrote on file systems that do not outlive a boot, and
// gives the node a new boot ID.
func (n *crashNode) reboot() {
	n.boots++
	if err := os.WriteFile(n.boot, fmt.Appendf(nil, "boot-%d\n", n.boots), 0o600); err != nil {
		n.t.Fatal(err)
	}
	n.forgetTmpfs()
	n.readers.stopAll()
	mps, _ := n.mounter.List()
	for _, mp := range mps {
		_ = n.mounter.Unmount(mp.Path)
	}
	n.loops.mu.Lock()
	clear(n.loops.dev)
	n.loops.mu.Unlock()
	n.drv.Reboot()
	for p := range n.volatile {
		if err := os.RemoveAll(p); err != nil {
			n.t.Fatal(err)
		}
	}
	clear(n.volatile)
}

// checkStep records a NodeUnstageVolume sent while the driver still had a
// publish of the volume: the one thing a crash must never let through; and
// what a reader of a configMap volume sees before the step (readers).
func (n *crashNode) checkStep(s step.Step) {
	n.readers.check(n)
	path, ok := strings.CutPrefix(s.Path, "NodeUnstageVolume ")
	if s.Op != step.Call || !ok {
		return
	}
	if h := n.handles[path]; h != "" {
		if pubs := n.drv.PublishedVolumes()[h]; len(pubs) > 0 {
			n.mu.Lock()
			n.violations = append(n.violations, fmt.Sprintf("NodeUnstageVolume %s while published at %v", path, pubs))
			n.mu.Unlock()
		}
	}
}

// start runs a manager on the node with hook h.
func (n *crashNode) start(h *steptest.Crasher) (*VolumeManager, func()) {
	t := n.t
	t.Helper()
	r, err := rootfs.New(n.root)
	if err != nil {
		t.Fatal(err)
	}
	mounter := &fdBinder{FakeMounter: n.mounter, binds: &n.binds}
	m := step.Mounter(mounter, h.Take)
	mapper := &blockdev.Mapper{Mounter: m, Loop: n.loops, Root: r.WithSteps(h.Take), Steps: h.Take,
		IsBlockDevice: func(string) (bool, error) { return true, nil }}
	cfg := Config{NodeName: node, KubeClient: n.client, RootDir: n.root, Mounter: mounter,
		BlockMapper: mapper, BootIDPath: n.boot, Steps: h.Take, SelfAttach: n.selfAttach, ClusterInformers: n.informers}
	if obj := n.nodeObj; obj != nil {
		cfg.Node = func() (*v1.Node, error) { return obj, nil }
	}
	vm, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	stop := func() { cancel(); <-done }
	if err := vm.Drivers().Register(ctx, n.drv.DriverName(), n.drv.Endpoint()); err != nil {
		stop()
		t.Fatal(err)
	}
	select {
	case <-vm.ready:
	case <-done:
		t.Fatal("Run returned before the manager was ready")
	}
	return vm, stop
}

// state is what a crash must not change: the driver's staged and
// published volumes, the mount table, the loop devices and the entries
// under the root.
type crashState struct {
	staged, published, mounts, loops, tree []string
	// api are the VolumeAttachments and the claims' sizes.
	api []string
}

func (n *crashNode) state() crashState {
	var s crashState
	staged, published := n.drv.StagedVolumes(), n.drv.PublishedVolumes()
	for _, h := range slices.Sorted(maps.Keys(staged)) {
		s.staged = append(s.staged, h+" at "+n.rel(staged[h]))
	}
	for _, h := range slices.Sorted(maps.Keys(published)) {
		for _, p := range published[h] {
			s.published = append(s.published, h+" at "+n.rel(p))
		}
	}
	s.mounts = n.mountEntries()
	n.loops.mu.Lock()
	for file := range n.loops.dev {
		s.loops = append(s.loops, n.rel(file))
	}
	n.loops.mu.Unlock()
	_ = filepath.WalkDir(n.root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && path != n.root {
			s.tree = append(s.tree, n.treeEntries(path, d)...)
		}
		return nil
	})
	ctx := context.Background()
	if vas, err := n.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{}); err == nil {
		for _, va := range vas.Items {
			s.api = append(s.api, fmt.Sprintf("VolumeAttachment %s attached=%v", va.Name, va.Status.Attached))
		}
	}
	if pvcs, err := n.client.CoreV1().PersistentVolumeClaims("ns").List(ctx, metav1.ListOptions{}); err == nil {
		for _, c := range pvcs.Items {
			size := c.Status.Capacity[v1.ResourceStorage]
			s.api = append(s.api, fmt.Sprintf("claim %s capacity %s conditions %d resize status %q", c.Name, size.String(),
				len(c.Status.Conditions), c.Status.AllocatedResourceStatuses[v1.ResourceStorage]))
		}
	}
	for _, l := range [][]string{s.staged, s.published, s.mounts, s.loops, s.tree, s.api} {
		slices.Sort(l)
	}
	return s
}

func (n *crashNode) rel(p string) string {
	if r, err := filepath.Rel(n.root, p); err == nil {
		return r
	}
	return p
}

// diff lists how s differs from want, "" when it does not.
func (s crashState) diff(want crashState) string {
	var b strings.Builder
	for _, f := range []struct {
		name      string
		got, want []string
	}{
		{"staged", s.staged, want.staged}, {"published", s.published, want.published},
		{"mounts", s.mounts, want.mounts}, {"loop devices", s.loops, want.loops}, {"under the root", s.tree, want.tree},
		{"API", s.api, want.api},
	} {
		for _, g := range f.got {
			if !slices.Contains(f.want, g) {
				fmt.Fprintf(&b, "%s: extra %s\n", f.name, g)
			}
		}
		for _, w := range f.want {
			if !slices.Contains(f.got, w) {
				fmt.Fprintf(&b, "%s: missing %s\n", f.name, w)
			}
		}
	}
	return b.String()
}

// converge adds wanted to a fresh manager, says the pods are synced and
// waits until the node's state is want (nil: until the wanted pods are
// mounted and the node idle, the baseline's way). A restarted manager
// then resyncs once, the pods' next sync (resyncNow). It returns the
// state reached.
func converge(ctx context.Context, vm *VolumeManager, n *crashNode, wanted, gone []*v1.Pod, settled func(*crashNode) bool, want *crashState, restarted bool) (crashState, error) {
	for _, p := range wanted {
		vm.AddPod(p)
	}
	vm.MarkPodsSynced()
	for _, p := range wanted {
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			return n.state(), err
		}
		if err := n.runContainers(ctx, vm, p); err != nil {
			return n.state(), err
		}
	}
	for _, p := range gone {
		if err := vm.WaitForUnmount(ctx, p); err != nil {
			return n.state(), err
		}
	}
	if restarted {
		if err := resyncNow(ctx, vm); err != nil {
			return n.state(), err
		}
	}
	var got crashState
	err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
		if !vm.idle() || settled != nil && !settled(n) {
			return false, nil
		}
		got = n.state()
		return want == nil || got.diff(*want) == "", nil
	})
	return got, err
}

// crashScenario is one operation under test.
type crashScenario struct {
	name string
	// opts are the driver's.
	opts csitest.Options
	// objects are the API objects; host is the node's directory outside
	// the root (for a local PV's path).
	objects func(driver, host string) []runtime.Object
	// node, if set, is this node's Node (Config.Node); hostDirs are
	// made under host first.
	node     *v1.Node
	hostDirs []string
	// before are mounted before the operation; after are wanted once it
	// is done; other is the other choice made while the agent was down.
	before, after, other []*v1.Pod
	// act starts the operation; settled, if set, tells when it is done
	// beyond the pods' mounts (an expansion).
	act     func(vm *VolumeManager, n *crashNode)
	settled func(n *crashNode) bool
	// selfAttach: the node attaches its volumes itself, with a fake
	// external-attacher beside it; informers: with
	// Config.ClusterInformers (an attachment a crash left is found by the
	// informer, not by the one-time list; a claim's resize is seen at
	// once, not at its next read).
	selfAttach, informers bool
	// prepare, if set, readies the node before its first manager starts
	// (the API server's reactors, what the readers expect).
	prepare func(n *crashNode)
}

// variant is what happens while the agent is down.
type crashVariant struct {
	name   string
	reboot bool
	wanted func(sc crashScenario) []*v1.Pod
}

var crashVariants = []crashVariant{
	{name: "as-acted", wanted: func(sc crashScenario) []*v1.Pod { return sc.after }},
	{name: "other-choice", wanted: func(sc crashScenario) []*v1.Pod { return sc.other }},
	{name: "reboot", reboot: true, wanted: func(sc crashScenario) []*v1.Pod { return sc.after }},
}

func (sc crashScenario) all() []*v1.Pod {
	var all []*v1.Pod
	for _, l := range [][]*v1.Pod{sc.before, sc.after, sc.other} {
		for _, p := range l {
			if !slices.ContainsFunc(all, func(q *v1.Pod) bool { return q.UID == p.UID }) {
				all = append(all, p)
			}
		}
	}
	return all
}

func without(all, wanted []*v1.Pod) []*v1.Pod {
	var out []*v1.Pod
	for _, p := range all {
		if !slices.ContainsFunc(wanted, func(q *v1.Pod) bool { return q.UID == p.UID }) {
			out = append(out, p)
		}
	}
	return out
}

// newNode makes the node of a run: its own driver, API objects and root.
func (sc crashScenario) newNode(t *testing.T) *crashNode {
	drv := csitest.New(t, sc.opts)
	host := t.TempDir()
	for _, d := range sc.hostDirs {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	objs := sc.objects(drv.DriverName(), host)
	client := fake.NewClientset(objs...)
	if sc.selfAttach {
		csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{Driver: drv.DriverName()})
	}
	n := newCrashNode(t, drv, client)
	n.selfAttach, n.informers, n.nodeObj = sc.selfAttach, sc.informers, sc.node
	if sc.prepare != nil {
		sc.prepare(n)
	}
	n.readers.add(objs...)
	for _, o := range objs {
		pv, ok := o.(*v1.PersistentVolume)
		if !ok || pv.Spec.CSI == nil {
			continue
		}
		h := pv.Spec.CSI.VolumeHandle
		if path, err := ondisk.StagingPath(n.root, drv.DriverName(), h); err == nil {
			n.handles[path] = h
		}
		if paths, err := ondisk.BlockVolumePaths(n.root, pv.Name, ""); err == nil {
			n.handles[paths.StagingPath] = h
		}
	}
	return n
}

// crashRun is what one run found.
type crashRun struct {
	// steps are the operation's steps taken; stop is the one it stopped
	// at (nil: it ran to the end).
	steps []step.Step
	stop  *step.Step
	// restartSteps are the steps of the manager that stopped while
	// recovering (restartAt > 0), restartStop the one it stopped at.
	restartSteps []step.Step
	restartStop  *step.Step
	// reconstructSteps are the steps of the last manager's reconstruction.
	reconstructSteps []step.Step
	state            crashState
}

// run is one run of the scenario in variant v, stopping at step at (0:
// never) of the operation and, if restartAt > 0, at that step of the
// recovering manager, then recovering with a clean one. want is the state
// to converge to (nil: the run is the baseline that finds it).
func (sc crashScenario) run(t *testing.T, v crashVariant, at, restartAt int, want *crashState) crashRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n := sc.newNode(t)
	var out crashRun

	// Before the operation, with no crash; then the operation, stopped
	// at step at.
	h := steptest.New(n.checkStep)
	vm, stop := n.start(h)
	if _, err := converge(ctx, vm, n, sc.before, nil, nil, nil, false); err != nil {
		stop()
		t.Fatalf("setting up: %v", err)
	}
	h.Arm(at)
	opCtx, opCancel := context.WithCancel(ctx)
	opDone := make(chan error, 1)
	go func() {
		sc.act(vm, n)
		_, err := converge(opCtx, vm, n, sc.after, without(sc.all(), sc.after), sc.settled, nil, false)
		opDone <- err
	}()
	select {
	case <-h.Crashed():
		opCancel()
		<-opDone
	case err := <-opDone:
		if err != nil {
			t.Fatalf("the operation, with no crash: %v", err)
		}
	}
	opCancel()
	stop()
	out.steps, out.stop = h.Steps()

	// While it is down.
	if v.reboot {
		n.reboot()
	}
	wanted := v.wanted(sc)
	gone := without(sc.all(), wanted)
	n.readers.stop(gone...) // deleted while the agent was down
	if restartAt > 0 {
		h := steptest.New(n.checkStep)
		h.Arm(restartAt)
		vm, stop = n.start(h)
		rctx, rcancel := context.WithCancel(ctx)
		rdone := make(chan struct{})
		go func() {
			defer close(rdone)
			_, _ = converge(rctx, vm, n, wanted, gone, nil, want, true)
		}()
		select {
		case <-h.Crashed():
		case <-rdone:
		}
		rcancel()
		<-rdone
		stop()
		out.restartSteps, out.restartStop = h.Steps()
	}

	// Recovery; the steps of its reconstruction are counted, for the
	// runs that stop there.
	rh := steptest.New(n.checkStep)
	rh.Arm(0)
	vm, stop = n.start(rh)
	defer stop()
	out.reconstructSteps, _ = rh.Steps()
	got, err := converge(ctx, vm, n, wanted, gone, nil, want, true)
	out.state = got
	if err != nil {
		msg := ""
		if want != nil {
			msg = got.diff(*want)
		}
		t.Errorf("no convergence: %v\n%s", err, msg)
	}
	n.mu.Lock()
	for _, v := range n.violations {
		t.Errorf("%s", v)
	}
	n.mu.Unlock()
	return out
}

// crashScenarios are the operations the suite stops at every step of.
func crashScenarios() []crashScenario {
	claimWith := func(name string, attach bool, spec csitest.PVSpec) func(string, string) []runtime.Object {
		return func(driver, _ string) []runtime.Object {
			spec.Driver, spec.Handle = driver, "h-"+name
			pvc, pv := csitest.BoundClaim("ns", name, spec)
			return []runtime.Object{csitest.CSIDriver(driver, csitest.CSIDriverSpec{AttachRequired: attach}), pvc, pv}
		}
	}
	claim := func(name string, attach bool) func(string, string) []runtime.Object {
		return claimWith(name, attach, csitest.PVSpec{})
	}
	blockClaim := func(driver, _ string) []runtime.Object {
		pvc, pv := csitest.BoundClaim("ns", "raw", csitest.PVSpec{Driver: driver, Handle: "h-raw", Block: true})
		return []runtime.Object{csitest.CSIDriver(driver, csitest.CSIDriverSpec{}), pvc, pv}
	}
	a := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	b := csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	ra := csitest.Pod("ns", "ra", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}})
	add := func(p *v1.Pod) func(*VolumeManager, *crashNode) {
		return func(vm *VolumeManager, _ *crashNode) { vm.AddPod(p) }
	}
	del := func(p *v1.Pod) func(*VolumeManager, *crashNode) {
		return func(vm *VolumeManager, n *crashNode) { n.readers.stop(p); vm.DeletePod(p) }
	}
	opts := csitest.Options{CreateTargetDirs: true}
	noStage := csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}
	return append([]crashScenario{
		{name: "stage-publish", opts: opts, objects: claim("vol", false), after: []*v1.Pod{a}, act: add(a)},
		{name: "unpublish-unstage", opts: opts, objects: claim("vol", false), before: []*v1.Pod{a}, other: []*v1.Pod{a}, act: del(a)},
		{name: "unpublish-shared", opts: opts, objects: claimWith("vol", false, csitest.PVSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}}),
			before: []*v1.Pod{a, b}, after: []*v1.Pod{b}, other: []*v1.Pod{a, b}, act: del(a)},
		{name: "publish-no-stage", opts: noStage, objects: claim("vol", false), after: []*v1.Pod{a}, act: add(a)},
		{name: "unpublish-no-stage", opts: noStage, objects: claim("vol", false), before: []*v1.Pod{a}, other: []*v1.Pod{a}, act: del(a)},
		{name: "block-stage-map", opts: opts, objects: blockClaim, after: []*v1.Pod{ra}, act: add(ra)},
		{name: "block-unmap-unstage", opts: opts, objects: blockClaim, before: []*v1.Pod{ra}, other: []*v1.Pod{ra}, act: del(ra)},
		{name: "self-attach", opts: opts, objects: claim("vol", true), selfAttach: true, after: []*v1.Pod{a}, act: add(a)},
		{name: "self-detach", opts: opts, objects: claim("vol", true), selfAttach: true, before: []*v1.Pod{a}, other: []*v1.Pod{a}, act: del(a)},
		{name: "self-attach-informers", opts: opts, objects: claim("vol", true), selfAttach: true, informers: true, after: []*v1.Pod{a}, act: add(a)},
		{name: "self-detach-informers", opts: opts, objects: claim("vol", true), selfAttach: true, informers: true, before: []*v1.Pod{a}, other: []*v1.Pod{a}, act: del(a)},
		{name: "expand", opts: csitest.Options{CreateTargetDirs: true, Expand: true}, objects: claimWith("vol", false, csitest.PVSpec{Capacity: "1Gi"}), informers: true,
			before: []*v1.Pod{a}, after: []*v1.Pod{a}, other: []*v1.Pod{a}, act: resize("vol", "2Gi", false), settled: resized("vol", "2Gi")},
		{name: "expand-resize-status", opts: csitest.Options{CreateTargetDirs: true, Expand: true}, objects: claimWith("vol", false, csitest.PVSpec{Capacity: "1Gi"}), informers: true,
			before: []*v1.Pod{a}, after: []*v1.Pod{a}, other: []*v1.Pod{a}, act: resize("vol", "2Gi", true), settled: resized("vol", "2Gi")},
	}, append(append(kindScenarios(claim("vol", false), add, del), objectScenarios(add, del)...), projectedScenarios(add, del)...)...)
}

// TestCrashPoints stops every scenario at every step of its operation, in
// every variant, and the recovering manager at every step of its
// reconstruction, and checks that the node converges to exactly the state
// a run without a crash leaves.
func TestCrashPoints(t *testing.T) {
	for _, sc := range crashScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, v := range crashVariants {
				base := sc.run(t, v, 0, 0, nil)
				if base.stop != nil || len(base.steps) == 0 {
					t.Fatalf("%s: the run without a crash stopped, or took no step: %v", v.name, base.steps)
				}
				t.Logf("%s: %d steps", v.name, len(base.steps))
				for k := 1; k <= len(base.steps); k++ {
					var r crashRun
					t.Run(fmt.Sprintf("%s/%d", v.name, k), func(t *testing.T) {
						r = sc.run(t, v, k, 0, &base.state)
						if r.stop == nil {
							t.Errorf("did not stop at step %d (%v)", k, base.steps[k-1])
						}
						if t.Failed() {
							t.Logf("stopped at step %d: %v", k, r.stop)
						}
					})
					// The restart stopped too, at each step of its
					// reconstruction's clean-up.
					for j := 1; j <= len(r.reconstructSteps); j++ {
						t.Run(fmt.Sprintf("%s/%d/restart-%d", v.name, k, j), func(t *testing.T) {
							r := sc.run(t, v, k, j, &base.state)
							if t.Failed() {
								t.Logf("stopped at step %d: %v, then in the restart at %v", k, r.stop, r.restartStop)
							}
						})
					}
				}
			}
		})
	}
}
