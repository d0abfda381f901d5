package main

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFaultReboot: a simulated reboot. The agent runs 4 pods with a boot
// ID file of the test's; then, as a reboot does, the agent and the driver
// die, every mount under the root goes, the loop devices are detached
// and the boot ID changes. The driver and the agent start again, the
// agent with two of the pods. nodevol's records are of the earlier boot:
// the volumes of the two pods that are gone are forgotten without a CSI
// call (their directories and records removed), and the two kept pods'
// volumes are staged and published afresh (one NodeStageVolume and one
// NodePublishVolume each), with the data written before the reboot.
func TestFaultReboot(t *testing.T) {
	requireFaultEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f5-", 4)
	boot := filepath.Join(e.root, "boot_id")
	writeBootID(t, boot, "boot-1")
	a := e.startAgent(e.withPods, "--boot-id-file", boot)
	a.expect(t, "READY", time.Minute)
	e.writeData(t)
	checkInvariant(t, e, "before the reboot", e.vols)

	a.kill()
	e.reboot(t)
	writeBootID(t, boot, "boot-2")
	e.startDriver(ctx)

	kept, gone := e.vols[:2], e.vols[2:]
	objects := e.objectsWith(t, "objects-kept.json", kept)
	from := fileSize(t, e.callLog)
	start := time.Now()
	a = e.startAgent(objects, "--boot-id-file", boot)
	a.expect(t, "READY 2", time.Minute)
	label := "after the reboot"
	converge(t, e, label, kept)
	calls := readCalls(t, e.callLog, from)
	logCalls(t, label, e.root, calls)
	t.Logf("%s: converged in %v; driver calls %v", label, time.Since(start).Round(time.Millisecond), callCounts(calls))
	for i := range gone {
		v := &gone[i]
		if n := teardownCalls(calls, v); n > 0 {
			t.Errorf("%s: pod %s is gone and its volume was not mounted any more, yet %d teardown calls were made", label, v.pod.Name, n)
		}
	}
	for i := range kept {
		v := &kept[i]
		if s, p := countCalls(calls, "NodeStageVolume", v), countCalls(calls, "NodePublishVolume", v); s != 1 || p != 1 {
			t.Errorf("%s: pod %s: %d NodeStageVolume and %d NodePublishVolume, want 1 and 1", label, v.pod.Name, s, p)
		}
	}

	e.endClean(t, a, "every pod deleted", time.Minute)
}

func writeBootID(t *testing.T, path, id string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// reboot does to the root what a reboot does: the driver stops, every
// mount under the root goes (deepest first) and the loop devices on the
// driver's images are detached. Files stay.
func (e *holdEnv) reboot(t *testing.T) {
	t.Helper()
	e.drv.stop()
	mps := mountPointsUnder(e.root)
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		if err := syscall.Unmount(mp, 0); err != nil {
			t.Fatalf("reboot: unmounting %s: %v", mp, err)
		}
	}
	for _, devs := range loopDevicesUnder(t, e.root) {
		for _, d := range devs {
			if out, err := exec.Command("losetup", "--detach", d.name).CombinedOutput(); err != nil {
				t.Fatalf("reboot: detaching %s: %v: %s", d, err, out)
			}
		}
	}
	if mps := mountPointsUnder(e.root); len(mps) > 0 {
		t.Fatalf("reboot: still mounted: %v", mps)
	}
}

// TestFaultPlantedSymlinks: symlinks planted under the root, on real
// mounts, with the agent as a process. Pod 0's directory pods/{uid} and
// volume 1's staging directory are symlinks to directories outside the
// root, and a pod directory nodevol never made (pods/uid-planted, as a
// container with a hostPath of the root could leave) is a symlink to an
// outside directory laid out like a published volume. Pods 0 and 1 fail
// with an error that names the symlink, pod 2 mounts, nothing is mounted
// outside the root, the outside directories are byte for byte the same
// (nothing created, written or removed there, the planted vol_data.json
// included, after MarkPodsSynced), and no teardown call is made for the
// planted volume.
func TestFaultPlantedSymlinks(t *testing.T) {
	requireFaultEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newHoldEnv(t, ctx, "nv-f6-", 3)
	outside := t.TempDir()
	podDir := filepath.Join(e.root, "pods", string(e.vols[0].pod.UID))
	stagingDir := filepath.Dir(e.vols[1].staging)
	planted := filepath.Join(e.root, "pods", "uid-planted")
	plantedVol := filepath.Join(outside, "c", "volumes", "kubernetes.io~csi", e.vols[2].pv)
	for _, d := range []string{filepath.Join(outside, "a"), filepath.Join(outside, "b"), filepath.Join(plantedVol, "mount")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range map[string]string{
		filepath.Join(outside, "a", "keep"):        "a",
		filepath.Join(outside, "b", "keep"):        "b",
		filepath.Join(plantedVol, "mount", "keep"): "c",
		filepath.Join(plantedVol, "vol_data.json"): `{"specVolID":"` + e.vols[2].pv + `","volumeHandle":"` + e.vols[2].handle + `","driverName":"` + e.drv.name + `","volumeLifecycleMode":"Persistent"}`,
	} {
		if err := os.WriteFile(name, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{podDir: filepath.Join(outside, "a"), stagingDir: filepath.Join(outside, "b"), planted: filepath.Join(outside, "c")} {
		if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	before := treeOf(t, outside)

	from := fileSize(t, e.callLog)
	a := e.startAgent(e.withPods, "--timeout", "10s")
	lines := a.collect(t, 3, time.Minute) // MOUNTED pod 2, FAILED pods 0 and 1, in any order
	for i, v := range e.vols {
		var got string
		for _, l := range lines {
			if strings.Contains(l, v.pod.Namespace+"/"+v.pod.Name) {
				got = l
			}
		}
		switch {
		case i < 2 && !(strings.HasPrefix(got, "FAILED") && strings.Contains(got, "is a symlink")):
			t.Errorf("pod %s: %q, want FAILED naming the symlink", v.pod.Name, got)
		case i == 2 && !strings.HasPrefix(got, "MOUNTED"):
			t.Errorf("pod %s: %q, want MOUNTED", v.pod.Name, got)
		}
	}
	if mps := mountPointsUnder(outside); len(mps) > 0 {
		t.Errorf("mounted outside the root: %v", mps)
	}
	if after := treeOf(t, outside); !maps.Equal(before, after) {
		t.Errorf("the outside directories changed:\nbefore %v\nafter  %v", before, after)
	}
	calls := readCalls(t, e.callLog, from)
	logCalls(t, "with planted symlinks", e.root, calls)
	for _, c := range calls {
		for _, p := range []string{c.target, c.staging} {
			if p != "" && (strings.HasPrefix(p, podDir+"/") || strings.HasPrefix(p, stagingDir+"/") || strings.HasPrefix(p, planted+"/")) {
				t.Errorf("the driver got a path through a symlink: %s %s", c.method, p)
			}
		}
		if c.method == "NodeUnpublishVolume" || c.method == "NodeUnstageVolume" {
			t.Errorf("teardown call %s %s: nothing was to be torn down", c.method, c.volume)
		}
	}

	for _, link := range []string{podDir, stagingDir, planted} {
		if err := os.Remove(link); err != nil { // the link, not what it points to
			t.Fatal(err)
		}
	}
	e.endClean(t, a, "every pod deleted, the symlinks removed", time.Minute)
	if after := treeOf(t, outside); !maps.Equal(before, after) {
		t.Errorf("the outside directories changed by the end:\nbefore %v\nafter  %v", before, after)
	}
}

// collect returns the agent's next n MOUNTED or FAILED lines.
func (a *agentProc) collect(t *testing.T, n int, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	var got []string
	for len(got) < n {
		select {
		case line, ok := <-a.lines:
			if !ok {
				t.Fatalf("agent exited after %v", got)
			}
			t.Logf("agent: %s", line)
			if strings.HasPrefix(line, "MOUNTED") || strings.HasPrefix(line, "FAILED") {
				got = append(got, line)
			}
		case <-deadline:
			t.Fatalf("agent: %d of %d MOUNTED or FAILED lines within %v: %v", len(got), n, timeout, got)
		}
	}
	return got
}

// treeOf maps every path under dir (relative) to its type and content.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(dir, p)
		switch {
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tree[r] = "file:" + string(b)
		default:
			tree[r] = d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}
