package kubeletbench

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	loopdriver "github.com/nodevol/nodevol/examples/loopdriver/driver"
)

// The kinds pods' inline ephemeral CSI volume "eph": both sides publish
// it at pods/{uid}/volumes/kubernetes.io~csi/eph/mount with the kubelet's
// volume ID (csi- + sha256(pod UID + "eph")) and write vol_data.json
// beside mount; the loop driver makes the volume in NodePublishVolume and
// deletes it in NodeUnpublishVolume.

// inlineHandle is the volume ID the kubelet gives the pod's eph volume.
func inlineHandle(p *hvPod) string {
	sum := sha256.Sum256([]byte(string(p.uid()) + "eph"))
	return "csi-" + hex.EncodeToString(sum[:])
}

// inlineTarget is where the pod's eph volume is published.
func (e *hvEnv) inlineTarget(p *hvPod) string {
	return filepath.Join(e.kindPath(p, "eph"), "mount")
}

// stateDir is the loop driver's state directory.
func (e *hvEnv) stateDir(d *hvDriver) string { return filepath.Join(e.root, "state-"+d.name) }

// inlineVolData checks that the loop driver has the pod's eph volume as
// an ephemeral one published at its target, and returns the pod's
// vol_data.json of it, which must say what the volume is.
func (e *hvEnv) inlineVolData(t *testing.T, p *hvPod) map[string]string {
	t.Helper()
	d := p.vols[0].driver
	st, err := loopdriver.ReadNodeState(e.stateDir(d), inlineHandle(p))
	if err != nil || !st.Ephemeral || st.StagingPath != "" || !slices.Equal(st.Targets, []string{e.inlineTarget(p)}) {
		t.Errorf("pod %s: the loop driver's inline volume: %+v, %v; want ephemeral, published at %s", p.name, st, err, rel(e.root, e.inlineTarget(p)))
	}
	var data map[string]string
	path := filepath.Join(e.kindPath(p, "eph"), "vol_data.json")
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &data)
	}
	if err != nil {
		t.Fatalf("pod %s: %s: %v", p.name, rel(e.root, path), err)
	}
	for k, want := range map[string]string{"specVolID": "eph", "volumeHandle": inlineHandle(p), "driverName": d.name,
		"nodeName": hvNode, "volumeLifecycleMode": "Ephemeral"} {
		if data[k] != want {
			t.Errorf("pod %s: %s: %s is %q, want %q (all: %v)", p.name, rel(e.root, path), k, data[k], want, data)
		}
	}
	return data
}

// checkInlineKept checks that the second side kept the pod's inline
// volume as the first side left it: the driver's record, and a
// vol_data.json that says the same (read as JSON: a side may write it
// again, in its own order of fields).
func (e *hvEnv) checkInlineKept(t *testing.T, p *hvPod, before map[string]string, side string) {
	t.Helper()
	if got := e.inlineVolData(t, p); !maps.Equal(got, before) {
		t.Errorf("pod %s: %s changed the inline volume's vol_data.json from %v to %v", p.name, side, before, got)
	}
}

// checkInlineGone waits until the pod's inline volume is deleted: the
// driver has no record and no image of it (it deletes them at the end of
// NodeUnpublishVolume, after the unmount a side waits for).
// checkNothingLeft checks the mounts and loop devices.
func (e *hvEnv) checkInlineGone(t *testing.T, p *hvPod) {
	t.Helper()
	d, id := p.vols[0].driver, inlineHandle(p)
	e.waitFor("the loop driver to delete the inline volume "+id+" of pod "+p.name, 2*time.Minute, func() bool {
		_, err := loopdriver.ReadNodeState(e.stateDir(d), id)
		_, ierr := os.Lstat(filepath.Join(e.stateDir(d), "volumes", id+".img"))
		return errors.Is(err, fs.ErrNotExist) && errors.Is(ierr, fs.ErrNotExist)
	})
}

// calls returns the lines of the driver's call log (one per Node
// service RPC: method, volume ID, target, staging path).
func (e *hvEnv) calls(t *testing.T, d *hvDriver) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.root, d.name+".calls"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// checkInlineUnpublished checks that since the call log had mark lines,
// the pod's inline volume was unpublished by NodeUnpublishVolume of its
// volume ID at its target, by side: the side recognised the other side's
// vol_data.json and tore the volume down through the driver.
func (e *hvEnv) checkInlineUnpublished(t *testing.T, p *hvPod, mark int, side string) {
	t.Helper()
	want := strings.Join([]string{"NodeUnpublishVolume", inlineHandle(p), e.inlineTarget(p), "-"}, "\t")
	if calls := e.calls(t, p.vols[0].driver); !slices.Contains(calls[min(mark, len(calls)):], want) {
		t.Errorf("pod %s: %s did not unpublish the inline volume (want %q); its calls:\n  %s", p.name, side, want, strings.Join(calls[min(mark, len(calls)):], "\n  "))
	}
}
