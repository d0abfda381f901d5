package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
)

// The invariant every fault test ends with: the node looks exactly as its
// wanted volumes say, whatever happened on the way.
//
//   - Mounts (/proc/self/mountinfo) under the root: exactly one at each
//     wanted volume's publish target and staging path, both showing the
//     volume's own loop device, and no other.
//   - Loop devices (/sys/block/loop*/loop/backing_file) whose backing file
//     is under the root: exactly one per wanted volume, backed by its image
//     in the loop driver's state directory, and no other.
//   - Files and directories under the root: the kubelet's layout of the
//     wanted volumes (pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount and
//     vol_data.json beside it; plugins/kubernetes.io/csi/{driver}/{sha256
//     of the handle}/globalmount and vol_data.json beside it), the test's
//     own files (harnessEntries), nodevol's record of each wanted pod
//     volume and staging directory (saying done), other nodevol files
//     (nodevolOwnedFiles), and the empty skeletons of podSkeletonDirs. Nothing else: no pod volume directory or staging
//     directory of a volume that is not wanted.
//   - Data: the file writeVolume wrote into a wanted volume (by any pod of
//     its claim) reads back unchanged.

// nodevolOwnedFiles are the files nodevol itself may keep under the root
// beside the kubelet's layout and its records, as filepath.Match patterns
// relative to the root. This is the one list of such allowed leftovers: a
// file that matches is allowed whether or not it is there; nothing else
// is. Its directory must be allowed on its own (a wanted volume's), so a
// file here never excuses a torn-down volume's directory. nodevol's
// records of work in flight are not here: each wanted volume's two
// records (ondisk.RecordFile of its pod volume and staging
// directories) are required, and say the stage and publish are done; any
// other record is left behind.
var nodevolOwnedFiles = []string{}

// podSkeletonDirs are the directories that may remain, empty, when a
// pod's volumes are gone: the volume manager removes a pod's volume
// directory (kubernetes.io~csi/{pv}, with its mount directory and
// vol_data.json) at unpublish, but pods/{uid}, pods/{uid}/volumes and
// pods/{uid}/volumes/kubernetes.io~csi stay (they do, for every pod
// whose volume was set up): a pod's own directories are removed by the
// pod's cleanup, which is the node agent's (the kubelet's housekeeping),
// not the volume manager's, and agent-fake does none. The plugin
// directories above the staging directories stay too. Each may or may
// not exist; nothing may be in them but what the invariant allows.
var podSkeletonDirs = []string{
	"pods",
	"pods/*",
	"pods/*/volumes",
	"pods/*/volumes/kubernetes.io~csi",
	"plugins",
	"plugins/kubernetes.io",
	"plugins/kubernetes.io/csi",
	"plugins/kubernetes.io/csi/*",
	"nodevol",
	"nodevol/records",
	"nodevol/records/*", // the records' hashed directories stay
}

// harnessEntries are the test's own files and directories under the root
// (filepath.Match patterns relative to it): logs, objects files, the
// kubeconfig, the loop driver's state directory (images) and socket
// directory, the registration directory of the registrar's socket. The
// invariant does not look into them.
func harnessEntries(e *holdEnv) []string {
	return []string{"calls.log", "agent.log", "loopdriver.log", "registrar.log", "objects*.json", "kubeconfig", "boot_id",
		"loopdriver", "plugins/" + e.drv.name, "plugins_registry"}
}

// checkInvariant reports, as errors, every way the node differs from the
// wanted volumes (see the comment at the top).
func checkInvariant(t *testing.T, e *holdEnv, label string, wanted []holdVolume) {
	t.Helper()
	problems := invariantProblems(t, e, wanted)
	for _, p := range problems {
		t.Errorf("%s: invariant: %s", label, p)
	}
	if len(problems) == 0 {
		t.Logf("%s: invariant holds for %d wanted volumes", label, len(wanted))
	}
}

// waitInvariant waits until the invariant holds (bounded by
// convergeMax) and reports whether it did; it logs what is still wrong
// if not.
func waitInvariant(t *testing.T, e *holdEnv, label string, wanted []holdVolume) bool {
	t.Helper()
	start := time.Now()
	var problems []string
	for deadline := start.Add(convergeMax); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if problems = invariantProblems(t, e, wanted); len(problems) == 0 {
			t.Logf("%s: converged in %v", label, time.Since(start).Round(time.Millisecond))
			return true
		}
	}
	t.Errorf("%s: not converged within %v: %s", label, convergeMax, strings.Join(problems, "; "))
	return false
}

// converge waits until the invariant holds, then until the agent has
// settled (no driver call, no mount change for settleQuiet), and checks
// the invariant again: nothing may undo it after the fact.
func converge(t *testing.T, e *holdEnv, label string, wanted []holdVolume) {
	t.Helper()
	waitInvariant(t, e, label, wanted)
	if !e.settle(t) {
		t.Errorf("%s: the agent did not settle: the call log or the mounts under %s still changed after %v", label, e.root, settleMax)
	}
	checkInvariant(t, e, label, wanted)
}

// convergeMax bounds a wait for the node to converge after a fault: a few
// backoffs of the volume manager (500 ms doubling) and of the informers
// (800 ms doubling, for a failing API), with room for a busy machine.
const convergeMax = 90 * time.Second

// invariantProblems lists every way the node differs from the wanted volumes.
func invariantProblems(t *testing.T, e *holdEnv, wanted []holdVolume) []string {
	t.Helper()
	var problems []string
	mounts := mountTableUnder(t, e.root)
	loops := loopDevicesUnder(t, e.root)
	wantedImages := map[string]bool{}
	wantedMounts := map[string]bool{}
	for _, v := range wanted {
		img := e.imagePath(v)
		wantedImages[img] = true
		devs := loops[img]
		if len(devs) != 1 {
			problems = append(problems, fmt.Sprintf("volume %s: %d loop devices %v, want 1", v.handle, len(devs), devs))
		}
		for _, p := range []string{v.target, v.staging} {
			wantedMounts[p] = true
			switch m := mounts[p]; {
			case len(m) != 1:
				problems = append(problems, fmt.Sprintf("%s: %d mounts, want 1", rel(e.root, p), len(m)))
			case len(devs) == 1 && m[0].dev != devs[0].dev:
				problems = append(problems, fmt.Sprintf("%s: mount of device %s, want %s (%s, the volume's loop device)", rel(e.root, p), m[0].dev, devs[0].dev, devs[0].name))
			}
		}
		if e.wrote[v.pv] && len(mounts[v.target]) == 1 {
			if got, err := os.ReadFile(filepath.Join(v.target, "hello.txt")); err != nil || string(got) != volumeData(v) {
				problems = append(problems, fmt.Sprintf("pod %s: its volume's data %q, %v; want %q, written before", v.pod.Name, got, err, volumeData(v)))
			}
		}
	}
	for p, m := range mounts {
		if !wantedMounts[p] {
			problems = append(problems, fmt.Sprintf("%s: %d mounts of a volume that is not wanted, want 0", rel(e.root, p), len(m)))
		}
	}
	for img, devs := range loops {
		if !wantedImages[img] {
			problems = append(problems, fmt.Sprintf("loop devices %v of %s, a volume that is not wanted", devs, rel(e.root, img)))
		}
	}
	problems = append(problems, e.dirProblems(t, wanted, mounts)...)
	slices.Sort(problems)
	return problems
}

// dirProblems compares what is under the root with the wanted volumes'
// layout; it does not look into mount points.
func (e *holdEnv) dirProblems(t *testing.T, wanted []holdVolume, mounts map[string][]mountEntry) []string {
	t.Helper()
	required := map[string]bool{} // relative path -> is a directory
	var problems []string
	r, err := rootfs.New(e.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range wanted {
		for _, leaf := range []string{v.target, v.staging} {
			dir := rel(e.root, filepath.Dir(leaf))
			required[filepath.Join(dir, "vol_data.json")] = false
			for d := leaf; d != e.root && d != "/"; d = filepath.Dir(d) {
				required[rel(e.root, d)] = true
			}
			rec := ondisk.RecordFile(dir)
			required[rec] = false
			required[filepath.Dir(rec)] = true
			if got, err := ondisk.ReadRecord(r, dir); err != nil || !got.Phase.Done() {
				problems = append(problems, fmt.Sprintf("%s: nodevol's record: %+v, %v; want a completed stage or publish", dir, got, err))
			}
		}
	}
	match := func(patterns []string, r string) bool {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, r); ok {
				return true
			}
		}
		return false
	}
	harness := harnessEntries(e)
	seen := map[string]bool{}
	err = filepath.WalkDir(e.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			problems = append(problems, fmt.Sprintf("walking %s: %v", rel(e.root, path), err))
			return nil
		}
		if path == e.root {
			return nil
		}
		r := rel(e.root, path)
		skip := func() error {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if match(harness, r) {
			return skip()
		}
		if isDir, ok := required[r]; ok {
			seen[r] = true
			if d.IsDir() != isDir || d.Type()&fs.ModeSymlink != 0 {
				problems = append(problems, fmt.Sprintf("%s: %v, want a %s", r, d.Type(), map[bool]string{true: "directory", false: "regular file"}[isDir]))
			}
			if len(mounts[path]) > 0 {
				return filepath.SkipDir // the volume's content is the data check's
			}
			return nil
		}
		switch {
		case d.IsDir() && match(podSkeletonDirs, r) && len(mounts[path]) == 0:
			return nil
		case d.Type().IsRegular() && match(nodevolOwnedFiles, r):
			return nil
		}
		problems = append(problems, fmt.Sprintf("%s: left behind (%v)", r, d.Type()))
		return skip() // one message for a whole directory
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("walking %s: %v", e.root, err))
	}
	for r := range required {
		if !seen[r] {
			problems = append(problems, fmt.Sprintf("%s: missing", r))
		}
	}
	return problems
}

// imagePath is the loop driver's image of the volume (its state
// directory's layout: volumes/{id}.img).
func (e *holdEnv) imagePath(v holdVolume) string {
	return filepath.Join(e.root, "loopdriver", "volumes", v.handle+".img")
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct{ id, dev string }

// mountTableUnder maps each mount point under root to its mounts, bottom
// first, as /proc/self/mountinfo lists them.
func mountTableUnder(t *testing.T, root string) map[string][]mountEntry {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]mountEntry{}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			out[f[4]] = append(out[f[4]], mountEntry{id: f[0], dev: f[2]})
		}
	}
	return out
}

// loopDevice is a bound loop device.
type loopDevice struct{ name, dev string }

func (d loopDevice) String() string { return d.name + "(" + d.dev + ")" }

// loopDevicesUnder maps each backing file under root (as the kernel has
// it, with " (deleted)" if the file was removed) to the loop devices
// bound to it.
func loopDevicesUnder(t *testing.T, root string) map[string][]loopDevice {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]loopDevice{}
	for _, f := range files {
		back, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		b := strings.TrimSpace(string(back))
		if !strings.HasPrefix(b, root+"/") {
			continue
		}
		sys := filepath.Dir(filepath.Dir(f))
		dev, err := os.ReadFile(filepath.Join(sys, "dev"))
		if err != nil {
			continue
		}
		out[b] = append(out[b], loopDevice{name: "/dev/" + filepath.Base(sys), dev: strings.TrimSpace(string(dev))})
	}
	return out
}

// podOf returns the volume v as another pod of its claim, named name, has
// it: same volume and staging path, the new pod's publish target.
func (e *holdEnv) podOf(v holdVolume, name string) holdVolume {
	claim := v.pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
	w := v
	w.pod = csitest.Pod(v.pod.Namespace, name, csitest.PodSpec{Node: e.node, Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
	w.target = filepath.Join(e.root, "pods", string(w.pod.UID), "volumes", "kubernetes.io~csi", v.pv, "mount")
	return w
}

// podKey is "namespace/name", as agent-fake names pods.
func podKey(v holdVolume) string { return v.pod.Namespace + "/" + v.pod.Name }

// addPod sends agent-fake the pod of v ("add") and waits for ADDED.
func (a *agentProc) addPod(t *testing.T, v holdVolume) {
	t.Helper()
	data, err := json.Marshal(v.pod)
	if err != nil {
		t.Fatal(err)
	}
	a.send(t, "add "+string(data))
	a.expect(t, "ADDED "+podKey(v), 10*time.Second)
}

// deletePod sends agent-fake "delete" for the pod of v and waits for DELETED.
func (a *agentProc) deletePod(t *testing.T, v holdVolume) {
	t.Helper()
	a.send(t, "delete "+podKey(v))
	a.expect(t, "DELETED "+podKey(v), 10*time.Second)
}

// cpuTicks returns the process's CPU time so far (utime + stime of
// /proc/PID/stat, all its threads), in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name may hold spaces and parentheses: fields count
	// from the last ')'. After it come field 3 (state) onwards; utime
	// and stime are fields 14 and 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return utime + stime
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// waitFor waits until cond holds, checking every 20 ms, and fails the
// test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
	}
}

// fileContains reports whether the file has s after byte offset from.
func fileContains(t *testing.T, path string, from int64, s string) bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(data)) > from && strings.Contains(string(data[from:]), s)
}

// countCalls counts the calls of method for the volume (any volume if
// v is nil) and, for the pod-side methods, the pod's target.
func countCalls(calls []call, method string, v *holdVolume) int {
	n := 0
	for _, c := range calls {
		if c.method != method || (v != nil && c.volume != v.handle) {
			continue
		}
		if v != nil && (method == "NodePublishVolume" || method == "NodeUnpublishVolume") && c.target != v.target {
			continue
		}
		n++
	}
	return n
}

// callCounts counts the calls by method, for logs and messages.
func callCounts(calls []call) map[string]int {
	m := map[string]int{}
	for _, c := range calls {
		m[c.method]++
	}
	return m
}

// endClean ends a test's agent: every pod is deleted through it, it says
// so within timeout, the invariant holds with nothing wanted (label names
// the check), and the agent stops.
func (e *holdEnv) endClean(t *testing.T, a *agentProc, label string, timeout time.Duration) {
	t.Helper()
	a.send(t, "delete-all")
	a.expect(t, "UNMOUNTED", timeout)
	waitInvariant(t, e, label, nil)
	a.stop()
}

// teardownCalls counts the NodeUnpublishVolume and NodeUnstageVolume calls
// for v.
func teardownCalls(calls []call, v *holdVolume) int {
	return countCalls(calls, "NodeUnpublishVolume", v) + countCalls(calls, "NodeUnstageVolume", v)
}
