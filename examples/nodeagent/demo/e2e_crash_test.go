package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/steptest"
	nvstep "github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestE2ECrashPoints is the crash-point suite of volumemanager/crash_test.go
// on a real node: the volume manager in this process with the real mounter
// (mount.New("")) and the plugin's default block mapper (real bind mounts
// and losetup), every step of which goes through a steptest.Crasher
// (Config.Steps); the loop driver in its own process, with real ext4 on
// loop devices. For a filesystem claim and a raw block claim (one pod
// each), and two operations each (stage+publish: the pod added;
// unpublish+unstage: the pod deleted), a run without a crash counts the
// operation's steps, then the operation is stopped at each step k (that
// step and every later one refused): the manager is dropped (its
// context cancelled, Run returned), while the driver process, the mounts
// and the loop devices stay, as after a kill. A new manager starts on the
// same root, is given the pod wanted (as acted, or the other choice made
// while the agent was down), MarkPodsSynced, and must converge to exactly
// the state a run without a crash leaves (nodeSnapshot: the mount table,
// the loop devices and every entry under the root, and the loop driver's
// record of the volume), with, for the filesystem claim, the invariant of
// e2e_invariant_test.go on top; nothing may change once it is stopped; the
// data written into the volume reads back whenever the pod is wanted; and
// no NodeUnstageVolume may be sent while the driver still has a publish of
// the volume (checked at each such step, and by the driver's own
// refusals, over the whole run).
//
// The reboot variant of the fake suite is not run: a reboot cannot be
// had on a real node under a test (the mounts and loop devices would have
// to go, and the boot ID change, with the test still running).
//
// The points run one after another on one root per claim: each run first
// brings the node to the operation's starting state with the manager it
// then crashes (not yet armed), so a run starts wherever the one before
// ended, and the volume (its data) is the same throughout. Every step is a
// point, not a sample: all of them (13 and 11 steps for the filesystem
// claim, 20 and 17 for the block claim, each in both variants) take about
// 15 s under -race on 2 cores.
func TestE2ECrashPoints(t *testing.T) {
	requireFaultEnv(t)
	start := time.Now()
	for _, kind := range []struct {
		name  string
		block bool
	}{{name: "filesystem"}, {name: "block", block: true}} {
		t.Run(kind.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := newCrashEnv(t, ctx, kind.block)
			c.runScenarios(t)
			c.checkRefusals(t)
			c.teardown(t)
		})
	}
	t.Logf("whole test %v", time.Since(start).Round(time.Millisecond))
}

// teardown ends with nothing wanted, through a manager with no crash, as
// the other end-to-end tests end: the cleanup has nothing left to undo.
func (c *crashEnv) teardown(t *testing.T) {
	t.Helper()
	vm, stop := c.start(t, steptest.New(c.checkStep))
	defer stop()
	if err := c.converge(t, vm, false, true); err != nil {
		t.Errorf("tearing down: %v", err)
	}
}

// crashConvergeMax bounds each wait for the node to reach a state: the
// volume manager retries a failed operation after 500 ms, doubling.
const crashConvergeMax = 30 * time.Second

// crashScenario is one operation on the claim's pod: whether the pod is
// wanted before and after it, and the operation itself.
type crashScenario struct {
	name          string
	before, after bool
	act           func(vm *volumemanager.VolumeManager, pod *v1.Pod)
}

var crashRootScenarios = []crashScenario{
	{name: "stage-publish", after: true, act: func(vm *volumemanager.VolumeManager, p *v1.Pod) { _ = vm.AddPod(p) }},
	{name: "unpublish-unstage", before: true, act: func(vm *volumemanager.VolumeManager, p *v1.Pod) { vm.DeletePod(p) }},
}

// crashRootVariant is what is wanted when the agent comes back.
type crashRootVariant struct {
	name   string
	wanted func(crashScenario) bool
}

var crashRootVariants = []crashRootVariant{
	{name: "as-acted", wanted: func(sc crashScenario) bool { return sc.after }},
	{name: "other-choice", wanted: func(sc crashScenario) bool { return !sc.after }},
}

// crashEnv is one claim's node: the root and the loop driver (holdEnv,
// which undoes everything at the end of the test), the API objects, the
// claim's pod and volume, and the node's state with and without the pod.
type crashEnv struct {
	*holdEnv
	ctx    context.Context
	block  bool
	client *fake.Clientset
	vol    holdVolume
	// states are the node's state with the pod (true) and without it
	// (false), as runs without a crash leave it.
	states map[bool]*nodeSnapshot
	// blockWritten: blockData was written into the block volume.
	blockWritten bool

	mu         sync.Mutex
	violations []string
}

func newCrashEnv(t *testing.T, ctx context.Context, block bool) *crashEnv {
	t.Helper()
	c := &crashEnv{ctx: ctx, block: block, states: map[bool]*nodeSnapshot{}}
	if !block {
		c.holdEnv = newHoldEnv(t, ctx, "nv-crf-", 1)
		c.vol = c.vols[0]
		c.client = fake.NewClientset(&c.objs.CSIDrivers[0], &c.objs.PersistentVolumes[0], &c.objs.PersistentVolumeClaims[0])
	} else {
		c.holdEnv = newHoldEnv(t, ctx, "nv-crb-", 0)
		handle := createBlockVolume(t, ctx, c.drv, "raw")
		pvc, pv := csitest.BoundClaim("demo", "raw", csitest.PVSpec{
			Driver:      c.drv.name,
			Handle:      handle,
			Block:       true,
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		})
		pod := csitest.Pod("demo", "pod-raw", csitest.PodSpec{Node: c.node, Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "raw", Block: true},
		}})
		paths, err := ondisk.BlockVolumePaths(c.root, pv.Name, pod.UID)
		if err != nil {
			t.Fatal(err)
		}
		// The driver's view: staged at the staging path, published at
		// the pod's publish path.
		c.vol = holdVolume{pod: pod, pv: pv.Name, handle: handle, target: paths.PublishPath, staging: paths.StagingPath}
		c.vols = []holdVolume{c.vol}
		c.client = fake.NewClientset(csitest.CSIDriver(c.drv.name, csitest.CSIDriverSpec{}), pvc, pv)
	}
	s := c.snapshot(t)
	c.states[false] = &s
	return c
}

// runScenarios runs each scenario without a crash (as acted and with the
// other choice), then at each sampled step in each variant. It stops at
// the first failure: the runs that follow start from what it left.
func (c *crashEnv) runScenarios(t *testing.T) {
	for _, sc := range crashRootScenarios {
		// Without a crash: as acted (the first finds the node's state
		// with the pod), with the other choice, and as acted again,
		// which counts the steps: from the second run on, the shared
		// directories (crashSharedDirs) that the first made are there,
		// as they are for every crashed run, and are not made again.
		start := time.Now()
		var base crashRootRun
		for _, v := range []crashRootVariant{crashRootVariants[0], crashRootVariants[1], crashRootVariants[0]} {
			if base = c.run(t, sc, v, 0); t.Failed() {
				return
			}
		}
		t.Logf("%s: %d steps, each a crash point", sc.name, len(base.steps))
		for i, s := range base.steps {
			t.Logf("%s: step %d: %s", sc.name, i+1, strings.ReplaceAll(s.String(), c.root+"/", ""))
		}
		for k := 1; k <= len(base.steps); k++ {
			for _, v := range crashRootVariants {
				ok := t.Run(fmt.Sprintf("%s/%s/%d", sc.name, v.name, k), func(t *testing.T) {
					r := c.run(t, sc, v, k)
					switch {
					case r.stop == nil:
						t.Errorf("did not stop at step %d (%v): %d steps taken", k, base.steps[k-1], len(r.steps))
					case sameStep(*r.stop, base.steps[k-1]):
						if t.Failed() {
							t.Logf("stopped at step %d: %v", k, *r.stop)
						}
					default:
						t.Errorf("stopped at step %d: %v, but the run without a crash took %v there: the steps drifted\nthis run's steps:\n  %s\nthe run without a crash:\n  %s",
							k, *r.stop, base.steps[k-1], stepLines(r.steps, r.stop), stepLines(base.steps, nil))
					}
				})
				if !ok {
					return
				}
			}
		}
		t.Logf("%s: %d points x %d variants in %v", sc.name, len(base.steps), len(crashRootVariants), time.Since(start).Round(time.Millisecond))
	}
}

// stepLines lists steps, and the step stopped at, one to a line.
func stepLines(steps []nvstep.Step, stop *nvstep.Step) string {
	lines := make([]string, 0, len(steps)+1)
	for i, s := range steps {
		lines = append(lines, fmt.Sprintf("%d: %v", i+1, s))
	}
	if stop != nil {
		lines = append(lines, fmt.Sprintf("stopped at: %v", *stop))
	}
	return strings.Join(lines, "\n  ")
}

// sameStep reports whether a and b are the same step, but for the random
// names of atomic writes' temporary files and the numbers of loop devices.
func sameStep(a, b nvstep.Step) bool {
	norm := func(p string) string {
		return loopName.ReplaceAllString(tmpName.ReplaceAllString(p, ".tmp-"), "/dev/loop")
	}
	return a.Op == b.Op && norm(a.Path) == norm(b.Path)
}

var (
	tmpName  = regexp.MustCompile(`\.tmp-[0-9a-f]+$`)
	loopName = regexp.MustCompile(`/dev/loop[0-9]+`)
)

// crashRootRun is what one run found: the operation's steps taken and the
// step it stopped at (nil: it ran to the end).
type crashRootRun struct {
	steps []nvstep.Step
	stop  *nvstep.Step
}

// run runs scenario sc in variant v, stopping the operation at step at
// (0: never).
func (c *crashEnv) run(t *testing.T, sc crashScenario, v crashRootVariant, at int) crashRootRun {
	t.Helper()
	var out crashRootRun
	pod := c.vol.pod

	// The starting state, with no crash; then the operation, stopped at
	// step at.
	h := steptest.New(c.checkStep)
	vm, stop := c.start(t, h)
	if err := c.converge(t, vm, sc.before, true); err != nil {
		t.Fatalf("setting up (pod wanted: %v): %v", sc.before, err)
	}
	if sc.before {
		c.write(t, vm)
	}
	h.Arm(at)
	sc.act(vm, pod)
	err := c.waitFor(t, vm, sc.after, h.Crashed())
	stop()
	out.steps, out.stop = h.Steps()
	if err != nil && out.stop == nil {
		t.Fatalf("the operation, with no crash: %v", err)
	}
	if at == 0 && c.states[sc.after] == nil {
		s := c.snapshot(t)
		c.states[sc.after] = &s
		t.Logf("the node's state with the pod wanted %v:\n  %s", sc.after, strings.Join(s.lines, "\n  "))
	}

	// Down, then back: a new manager given the pod if it is wanted.
	wanted := v.wanted(sc)
	h = steptest.New(c.checkStep)
	vm, stop = c.start(t, h)
	defer stop()
	if err := c.converge(t, vm, wanted, false); err != nil {
		t.Errorf("restarted with the pod wanted %v: no convergence: %v", wanted, err)
	} else {
		if wanted {
			c.checkData(t, vm)
		}
		stop()
		if d := c.snapshot(t).diff(*c.states[wanted]); d != "" {
			t.Errorf("restarted with the pod wanted %v: the node changed once the manager had converged and stopped:\n%s", wanted, d)
		}
	}
	c.mu.Lock()
	for _, msg := range c.violations {
		t.Errorf("%s", msg)
	}
	c.violations = nil
	c.mu.Unlock()
	return out
}

// start runs a volume manager on the node with the real mounter, the
// default block mapper and hook h, and registers the loop driver with it.
func (c *crashEnv) start(t *testing.T, h *steptest.Crasher) (*volumemanager.VolumeManager, func()) {
	t.Helper()
	return startVolumeManager(t, c.ctx, volumemanager.Config{NodeName: c.node, KubeClient: c.client, RootDir: c.root,
		Mounter: mount.New(""), Steps: h.Take}, c.drv.name, c.drv.endpoint)
}

// converge gives a new manager the pod if it is wanted, says the pods are
// synced and waits until the node is in its state for that.
func (c *crashEnv) converge(t *testing.T, vm *volumemanager.VolumeManager, wanted, setup bool) error {
	t.Helper()
	if wanted {
		if err := vm.AddPod(c.vol.pod); err != nil {
			return err
		}
	}
	vm.MarkPodsSynced()
	err := c.waitFor(t, vm, wanted, nil)
	if err != nil && setup && c.states[wanted] != nil {
		return fmt.Errorf("%w\n%s", err, c.snapshot(t).diff(*c.states[wanted]))
	}
	return err
}

// waitFor waits (bounded by crashConvergeMax) until the node is in its
// state with the pod wanted or not, or until stopped is closed. It
// returns the problems still seen if it times out.
func (c *crashEnv) waitFor(t *testing.T, vm *volumemanager.VolumeManager, wanted bool, stopped <-chan struct{}) error {
	t.Helper()
	var problems []string
	err := wait.PollUntilContextTimeout(c.ctx, 20*time.Millisecond, crashConvergeMax, true, func(context.Context) (bool, error) {
		select {
		case <-stopped:
			return true, nil
		default:
		}
		problems = c.problems(t, vm, wanted)
		return len(problems) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.Join(problems, "; "))
	}
	return nil
}

// problems lists how the node and the manager differ from their state
// with the pod wanted or not: the manager's view of the pod and of the
// volumes in use; the node's state as a run without a crash leaves it
// (once known); for a filesystem volume, the invariant; the driver's
// record of the volume.
func (c *crashEnv) problems(t *testing.T, vm *volumemanager.VolumeManager, wanted bool) []string {
	t.Helper()
	var problems []string
	pod := c.vol.pod
	if mounted := len(vm.GetMountedVolumesForPod(pod.UID)); wanted && mounted != 1 {
		problems = append(problems, fmt.Sprintf("the pod has %d volumes mounted, want 1", mounted))
	}
	if !wanted && vm.HasPossiblyMountedVolumesForPod(pod.UID) {
		problems = append(problems, "the pod may still have its volume mounted")
	}
	if inUse := vm.GetVolumesInUse(); len(inUse) != 0 {
		// The loop driver needs no attach: as the kubelet's, no volume of it is in use.
		problems = append(problems, fmt.Sprintf("volumes in use %v, want none (the driver needs no attach)", inUse))
	}
	if want := c.states[wanted]; want != nil {
		if d := c.snapshot(t).diff(*want); d != "" {
			problems = append(problems, d)
		}
	}
	var vols []holdVolume
	var p *holdVolume
	if wanted {
		vols, p = []holdVolume{c.vol}, &c.vol
	}
	if !c.block {
		problems = append(problems, invariantProblems(t, c.holdEnv, vols)...)
	}
	if d := c.driverStateProblem(c.vol, p); d != "" {
		problems = append(problems, d)
	}
	return problems
}

// blockData is what is written into the block volume.
var blockData = bytes.Repeat([]byte("nodevol crash point "), 200)

// write writes into the pod's volume, mounted, as its container would.
func (c *crashEnv) write(t *testing.T, vm *volumemanager.VolumeManager) {
	t.Helper()
	if !c.block {
		c.writeVolume(t, c.vol)
		return
	}
	writeAt(t, c.devicePath(t, vm), blockData)
	c.blockWritten = true
}

// checkData reads back what write wrote (the filesystem's is the
// invariant's), or writes it if nothing was yet.
func (c *crashEnv) checkData(t *testing.T, vm *volumemanager.VolumeManager) {
	t.Helper()
	switch {
	case !c.block && !c.wrote[c.vol.pv], c.block && !c.blockWritten:
		c.write(t, vm)
	case c.block:
		if got := readAt(t, c.devicePath(t, vm), len(blockData)); !bytes.Equal(got, blockData) {
			t.Errorf("the block volume's data: %q..., want what was written before", got[:20])
		}
	}
}

// devicePath is the pod's block device, as the manager has it mounted.
func (c *crashEnv) devicePath(t *testing.T, vm *volumemanager.VolumeManager) string {
	t.Helper()
	vols := vm.GetMountedVolumesForPod(c.vol.pod.UID)
	if len(vols) != 1 {
		t.Fatalf("pod %s: %d volumes mounted, want 1", c.vol.pod.Name, len(vols))
	}
	return vols[0].Path
}

// checkStep records a NodeUnstageVolume sent while the driver still had
// a publish of the volume.
func (c *crashEnv) checkStep(s nvstep.Step) {
	if s.Op != nvstep.Call || !strings.HasPrefix(s.Path, "NodeUnstageVolume ") {
		return
	}
	st, err := driver.ReadNodeState(filepath.Join(c.root, "loopdriver"), c.vol.handle)
	if err != nil || len(st.Targets) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, fmt.Sprintf("%s while the driver has it published at %v", s, rels(c.root, st.Targets)))
}

// checkRefusals: the driver refused no NodeUnstageVolume because the
// volume was still published, over the whole run (the soak's check).
func (c *crashEnv) checkRefusals(t *testing.T) {
	t.Helper()
	(&soak{e: c.holdEnv}).checkRefusals(t, "crash points")
}

// nodeSnapshot is what a crash must not change, as sorted lines relative
// to the root: each mount point and what is mounted there (an image of
// the loop driver's through its loop device, or the device number), the
// loop devices by backing file, every entry under the root (not looking
// into mount points; the test's own files and the shared directories of
// crashSharedDirs left out), and the loop driver's record of the volume.
type nodeSnapshot struct{ lines []string }

// crashSharedDirs are the directories of the layout that hold many
// volumes' (podSkeletonDirs, and the block layout's): that a crash made
// or left one of them is not a leak; what is in them is compared.
var crashSharedDirs = append(slices.Clone(podSkeletonDirs),
	"pods/*/volumeDevices", "pods/*/volumeDevices/kubernetes.io~csi",
	"plugins/kubernetes.io/csi/volumeDevices/staging", "plugins/kubernetes.io/csi/volumeDevices/publish")

func (c *crashEnv) snapshot(t *testing.T) nodeSnapshot {
	t.Helper()
	var s nodeSnapshot
	mounts := mountTableUnder(t, c.root)
	loops := loopDevicesUnder(t, c.root)
	image := map[string]string{} // device number -> its backing file
	for file, devs := range loops {
		for _, d := range devs {
			image[d.dev] = rel(c.root, file)
		}
		s.lines = append(s.lines, fmt.Sprintf("loop devices on %s: %d", rel(c.root, file), len(devs)))
	}
	for p, ms := range mounts {
		var what []string
		for _, m := range ms {
			if f := image[m.dev]; f != "" {
				what = append(what, "loop device of "+f)
			} else {
				what = append(what, "device "+m.dev)
			}
		}
		s.lines = append(s.lines, fmt.Sprintf("mount %s: %s", rel(c.root, p), strings.Join(what, ", ")))
	}
	match := func(patterns []string, r string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { ok, _ := filepath.Match(p, r); return ok })
	}
	harness := harnessEntries(c.holdEnv)
	err := filepath.WalkDir(c.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			s.lines = append(s.lines, fmt.Sprintf("walking %s: %v", rel(c.root, path), err))
			return nil
		}
		r := rel(c.root, path)
		switch {
		case path == c.root:
			return nil
		case match(harness, r):
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case d.IsDir() && match(crashSharedDirs, r) && len(mounts[path]) == 0:
			return nil
		}
		kind := d.Type().String()
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			kind += " -> " + rel(c.root, target)
		}
		s.lines = append(s.lines, fmt.Sprintf("entry %s: %s", r, kind))
		if d.IsDir() && len(mounts[path]) > 0 {
			return filepath.SkipDir // the volume's content is the data check's
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := driver.ReadNodeState(filepath.Join(c.root, "loopdriver"), c.vol.handle)
	if err != nil {
		t.Fatal(err)
	}
	s.lines = append(s.lines, fmt.Sprintf("driver: staged at %q, published at %v", rel(c.root, st.StagingPath), rels(c.root, st.Targets)))
	slices.Sort(s.lines)
	return s
}

// diff lists how s differs from want, "" when it does not.
func (s nodeSnapshot) diff(want nodeSnapshot) string {
	var b strings.Builder
	for _, g := range s.lines {
		if !slices.Contains(want.lines, g) {
			fmt.Fprintf(&b, "  extra: %s\n", g)
		}
	}
	for _, w := range want.lines {
		if !slices.Contains(s.lines, w) {
			fmt.Fprintf(&b, "  missing: %s\n", w)
		}
	}
	return b.String()
}
