package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/roottest"
)

// Fault tests: the loop driver or the agent dies in the middle of the
// work, or the API server fails, on real ext4 volumes on loop devices
// with real mounts (the harness of e2e_restart_hold_test.go: the agent and
// the driver are separate processes, the driver keeps a call log). Each
// test ends with checkInvariant (e2e_invariant_test.go): the node looks
// exactly as the wanted volumes say, and the data written before the
// fault is still there.

// requireFaultEnv skips under -short and when not root.
func requireFaultEnv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end to end with real mounts and crashes: skipped with -short")
	}
	roottest.Require(t)
}

// nodeMethods are the Node RPCs that change a node's mounts.
var nodeMethods = []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"}

// TestFaultDriverDiesMidCall: the loop driver dies inside each Node RPC
// that changes mounts, in two ways, while the agent keeps running (with
// its one connection to the driver); the driver comes back on the same
// socket and state directory without the fault, and the volumes converge.
//
//   - exit: the driver exits by itself at the RPC's mid point (the loop
//     device attached but nothing mounted, the bind mount made but not
//     recorded, the target unmounted but not forgotten, the staging path
//     unmounted but the device not detached);
//   - kill: the RPC waits at its start (a delay fault: nothing done yet)
//     and the driver is SIGKILLed once the fault has fired.
//
// Two pods, each with its volume: the first is wanted throughout and must
// not be touched. For stage and publish, the second pod is deleted (torn
// down normally) and a new pod of the same claim comes, whose stage or
// publish meets the fault; for unpublish and unstage, the second pod is
// deleted and its teardown meets it. Either way the data written into the
// second volume before the fault must survive (a stage interrupted after
// the loop device was attached must not reformat it).
func TestFaultDriverDiesMidCall(t *testing.T) {
	requireFaultEnv(t)
	ways := []struct{ name, actions string }{
		{"exit", "exit"}, // at=mid by default
		{"kill", "delay=10m,at=start"},
	}
	for _, method := range nodeMethods {
		for _, way := range ways {
			t.Run(method+"/"+way.name, func(t *testing.T) {
				// Each case has its own root, driver and agent, and
				// spends most of its time waiting (backoffs, settling):
				// they run side by side (go test -parallel, GOMAXPROCS
				// by default).
				t.Parallel()
				driverDiesMidCall(t, method, way.name, way.actions)
			})
		}
	}
}

// driverDiesMidCall is one case of TestFaultDriverDiesMidCall: the
// driver's Node RPC method meets the fault actions (--fault syntax) for
// the second volume, and the driver is gone by way ("exit" on its own,
// "kill" by the test once the fault has fired).
func driverDiesMidCall(t *testing.T, method, way, actions string) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f1-", 2)
	a := e.startAgent(e.withPods)
	a.expect(t, "READY", time.Minute)
	e.writeData(t)
	kept, victim := e.vols[0], e.vols[1]
	before := e.mountIDs(t, true)

	wanted := []holdVolume{kept}
	var trigger func()
	var done string   // the agent's line once the victim's pod is through
	subject := victim // the pod whose call meets the fault
	switch method {
	case "NodeStageVolume", "NodePublishVolume":
		a.deletePod(t, victim)
		a.expect(t, "GONE "+podKey(victim), time.Minute)
		if !waitInvariant(t, e, "the second pod deleted, before the fault", wanted) {
			t.FailNow()
		}
		again := e.podOf(victim, "again")
		wanted, subject = append(wanted, again), again
		trigger = func() { a.addPod(t, again) }
		done = "MOUNTED " + podKey(again)
	default:
		trigger = func() { a.deletePod(t, victim) }
		done = "GONE " + podKey(victim)
	}

	fault := method + "/" + victim.handle + ":" + actions
	e.restartDriver(ctx, fault)
	driverLog := filepath.Join(e.root, "loopdriver.log")
	logFrom := fileSize(t, driverLog)
	trigger()
	waitFor(t, "the driver's fault "+fault, time.Minute, func() bool {
		return fileContains(t, driverLog, logFrom, "Injecting fault")
	})
	switch way {
	case "exit":
		select {
		case <-e.drv.exited:
		case <-time.After(time.Minute):
			t.Fatalf("the driver did not exit on its fault %s", fault)
		}
	case "kill":
		e.drv.kill()
	}
	crashed := time.Now()
	restarted := fileSize(t, e.callLog)
	e.startDriver(ctx) // same socket and state directory, no fault
	a.expect(t, done, time.Minute)
	label := fmt.Sprintf("%s %s: after the driver's restart", method, way)
	converge(t, e, label, wanted)
	calls := readCalls(t, e.callLog, restarted)
	logCalls(t, label, e.root, calls)
	e.compareVolumeMounts(t, label+", the untouched pod", []holdVolume{kept}, before, e.mountIDs(t, false))
	if n := countCalls(calls, method, &subject); n == 0 {
		t.Errorf("%s: no %s for %s (pod %s) after the restart: the interrupted call was not retried", label, method, subject.handle, subject.pod.Name)
	}
	t.Logf("%s: converged %v after the crash; calls after the restart %v; whole case %v",
		label, time.Since(crashed).Round(time.Millisecond), callCounts(calls), time.Since(start).Round(time.Millisecond))

	e.endClean(t, a, label+", every pod deleted", time.Minute)
}

// TestFaultAgentKilledWhileMounting: the agent is SIGKILLed while 20 pods
// mount, and started again on the same root with the same pods: they
// converge. Then, all mounted and written to, it is SIGKILLed again and
// started again: nothing is mounted anew (the mount IDs are the same),
// nothing is torn down (no NodeUnpublishVolume or NodeUnstageVolume) and,
// with nodevol's records of the completed calls, nothing is called again.
func TestFaultAgentKilledWhileMounting(t *testing.T) {
	requireFaultEnv(t)
	const pods = 20
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f2-", pods)

	start := time.Now()
	a := e.startAgent(e.withPods)
	// Under way: a quarter of the publishes sent.
	waitFor(t, "a quarter of the pods' NodePublishVolume", 2*time.Minute, func() bool {
		return countCalls(readCalls(t, e.callLog, 0), "NodePublishVolume", nil) >= pods/4
	})
	a.kill()
	atKill := callCounts(readCalls(t, e.callLog, 0))
	t.Logf("agent killed %v after its start while mounting: driver calls so far %v, %d mount points under the root",
		time.Since(start).Round(time.Millisecond), atKill, len(mountTableUnder(t, e.root)))
	if atKill["NodePublishVolume"] >= pods {
		t.Logf("note: every pod had its NodePublishVolume sent before the kill")
	}

	from := fileSize(t, e.callLog)
	restart := time.Now()
	a = e.startAgent(e.withPods)
	a.expect(t, "READY", 2*time.Minute)
	converge(t, e, "after the restart while mounting", e.vols)
	calls := readCalls(t, e.callLog, from)
	t.Logf("after the restart while mounting: READY and converged in %v; driver calls %v",
		time.Since(restart).Round(time.Millisecond), callCounts(calls))
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume"} {
		if n := countCalls(calls, m, nil); n > 0 {
			t.Errorf("after the restart while mounting: %d %s of wanted pods, want 0", n, m)
		}
	}

	e.writeData(t)
	before := e.mountIDs(t, true)
	a.kill()
	from = fileSize(t, e.callLog)
	restart = time.Now()
	a = e.startAgent(e.withPods)
	a.expect(t, "READY", 2*time.Minute)
	label := "after the restart with everything mounted"
	converge(t, e, label, e.vols)
	calls = readCalls(t, e.callLog, from)
	logCalls(t, label, e.root, calls)
	t.Logf("%s: READY and settled in %v; driver calls %v", label, time.Since(restart).Round(time.Millisecond), callCounts(calls))
	// Nothing torn down, and nothing called again either: nodevol's
	// records say every stage and publish completed on this boot, and the
	// mounts are there.
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume", "NodeStageVolume", "NodePublishVolume"} {
		if n := countCalls(calls, m, nil); n > 0 {
			t.Errorf("%s: %d %s, want 0", label, n, m)
		}
	}
	e.compareMounts(t, label, before, e.mountIDs(t, false))

	e.endClean(t, a, "every pod deleted", 2*time.Minute)
}

// TestFaultPodsDeletedWhileAgentDown: the agent is SIGKILLed with six
// pods mounted; three of them are deleted while it is down (it restarts
// with an objects file without them). Their volumes are unpublished and
// unstaged; the other three are not touched (same mount IDs, no call that
// tears them down).
func TestFaultPodsDeletedWhileAgentDown(t *testing.T) {
	requireFaultEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f3-", 6)
	a := e.startAgent(e.withPods)
	a.expect(t, "READY", time.Minute)
	e.writeData(t)
	before := e.mountIDs(t, true)
	a.kill()

	kept, gone := e.vols[:3], e.vols[3:]
	objects := e.objectsWith(t, "objects-kept.json", kept)
	from := fileSize(t, e.callLog)
	restart := time.Now()
	a = e.startAgent(objects)
	a.expect(t, "READY 3", time.Minute)
	label := "after the restart without three pods"
	converge(t, e, label, kept)
	calls := readCalls(t, e.callLog, from)
	logCalls(t, label, e.root, calls)
	t.Logf("%s: converged and settled in %v; driver calls %v", label, time.Since(restart).Round(time.Millisecond), callCounts(calls))
	for i := range gone {
		v := &gone[i]
		if countCalls(calls, "NodeUnpublishVolume", v) == 0 || countCalls(calls, "NodeUnstageVolume", v) == 0 {
			t.Errorf("%s: deleted pod %s: its volume %s was not unpublished and unstaged through the driver", label, v.pod.Name, v.handle)
		}
	}
	for i := range kept {
		v := &kept[i]
		if n := teardownCalls(calls, v); n > 0 {
			t.Errorf("%s: kept pod %s: %d teardown calls, want 0", label, v.pod.Name, n)
		}
	}
	e.compareVolumeMounts(t, label, kept, before, e.mountIDs(t, false))

	e.endClean(t, a, "every pod deleted", time.Minute)
}

// TestFaultAPIFailsDuringRestart: the agent restarts, with pods mounted,
// while every list and get of PVCs, PVs and VolumeAttachments fails;
// while the API fails, a mounted pod is deleted, a new pod is added, and
// another is added and deleted again. As long as the API fails nothing
// that is mounted is unmounted (the pods cannot be resolved, so what was
// found on disk is held) and the agent does not spin: its CPU time over a
// window in which it can only wait stays under maxIdleCPU. Once the API
// answers again everything converges: the deleted pod's volume is torn
// down, the new pod's is mounted, the others are untouched.
func TestFaultAPIFailsDuringRestart(t *testing.T) {
	requireFaultEnv(t)
	const (
		window     = 3 * time.Second
		maxIdleCPU = 0.20 // of one CPU
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f4-", 6)
	running, deleted, added, brief := e.vols[:3], e.vols[3], e.vols[4], e.vols[5]
	first := e.objectsWith(t, "objects-first.json", e.vols[:4])
	a := e.startAgent(first)
	a.expect(t, "READY 4", time.Minute)
	for _, v := range e.vols[:4] {
		e.writeVolume(t, v)
	}
	checkInvariant(t, e, "before the restart", e.vols[:4])
	before := e.mountIDs(t, false)
	a.kill()

	from := fileSize(t, e.callLog)
	restart := time.Now()
	a = e.startAgent(first, "--api-fail", "--timeout", "3m")
	a.expect(t, "SYNCED", time.Minute)
	a.deletePod(t, deleted)
	a.addPod(t, added)
	a.addPod(t, brief)
	a.deletePod(t, brief)
	a.expect(t, "GONE "+podKey(brief), time.Minute) // it never had a volume

	// The agent can only wait now: for the API.
	pid := a.cmd.Process.Pid
	t0, c0 := time.Now(), cpuTicks(t, pid)
	<-time.After(window) // the measurement window, not a wait for a condition
	c1, elapsed := cpuTicks(t, pid), time.Since(t0)
	cpu := float64(c1-c0) / clockTicks / elapsed.Seconds()
	t.Logf("API failing: agent CPU %.1f%% of one CPU over %v (%d ticks of 1/%d s)", 100*cpu, elapsed.Round(time.Millisecond), c1-c0, clockTicks)
	if cpu > maxIdleCPU {
		t.Errorf("API failing: agent CPU %.1f%% of one CPU while it can only wait, want under %.0f%%: a hot loop", 100*cpu, 100*maxIdleCPU)
	}
	label := "API failing since the restart"
	calls := readCalls(t, e.callLog, from)
	logCalls(t, label, e.root, calls)
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume"} {
		if n := countCalls(calls, m, nil); n > 0 {
			t.Errorf("%s: %d %s, want 0: nothing mounted may be torn down while its pods cannot be resolved", label, n, m)
		}
	}
	e.compareVolumeMounts(t, label, e.vols[:4], before, e.mountIDs(t, false))
	checkInvariant(t, e, label+" (the pods' state before the restart)", e.vols[:4])

	from = fileSize(t, e.callLog)
	a.send(t, "api-fail off")
	a.expect(t, "API-FAIL off", 10*time.Second)
	back := time.Now()
	wanted := append(append([]holdVolume{}, running...), added)
	a.expect(t, "MOUNTED "+podKey(added), 2*time.Minute)
	label = "after the API came back"
	converge(t, e, label, wanted)
	calls = readCalls(t, e.callLog, from)
	logCalls(t, label, e.root, calls)
	t.Logf("%s: converged and settled %v after api-fail off (%v after the restart); driver calls %v",
		label, time.Since(back).Round(time.Millisecond), time.Since(restart).Round(time.Millisecond), callCounts(calls))
	if countCalls(calls, "NodeUnpublishVolume", &deleted) == 0 || countCalls(calls, "NodeUnstageVolume", &deleted) == 0 {
		t.Errorf("%s: the pod deleted while the API failed: its volume was not unpublished and unstaged", label)
	}
	for i := range running {
		v := &running[i]
		if n := teardownCalls(calls, v); n > 0 {
			t.Errorf("%s: running pod %s: %d teardown calls, want 0", label, v.pod.Name, n)
		}
	}
	e.compareVolumeMounts(t, label, running, before, e.mountIDs(t, false))

	e.endClean(t, a, "every pod deleted", time.Minute)
}
