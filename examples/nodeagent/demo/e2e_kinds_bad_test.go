package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/volumemanager"
)

// TestAllKindsBadInput gives the volume manager pods whose one volume,
// "bad", cannot be set up, and checks that WaitForAttachAndMount says so:
// the error names the pod, the volume and the cause, and is final
// (errors.Is(err, volumemanager.ErrFinal)) where no wait can mend it (a
// kind nodevol does not handle, a source that is invalid for good); the
// others (a host path of the wrong type or missing, a local PV of another
// node: the host or the Node's labels may change) are retried, and the
// wait runs out. Nothing is created or mounted for any of them, under the
// root or on the host.
func TestAllKindsBadInput(t *testing.T) {
	e := newKindsEnv(t, "nv-kindb-")
	vm, _, _ := e.start()
	file := filepath.Join(e.host, "a-file")
	writeFile(t, file, "a file\n")
	missing := filepath.Join(e.host, "missing")
	otherDir := filepath.Join(e.host, "local-other")
	e.localClaim("local-other", otherDir, "node-2")

	for i, c := range []struct {
		name  string
		vol   v1.Volume
		final bool
		cause string
	}{
		{"hostPath Directory that is a file", hostPathVolume("bad", file, v1.HostPathDirectory), false,
			"hostPath type check failed: " + file + " is not a directory, it's a File"},
		{"hostPath File that does not exist", hostPathVolume("bad", missing, v1.HostPathFile), false,
			fmt.Sprintf("path %q does not exist", missing)},
		{"local PV of another node", claimVolume("bad", "local-other"), false,
			"PV local-other: node affinity: no matching NodeSelectorTerms for node " + kindsNode},
		{"iscsi", v1.Volume{Name: "bad", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}}}, true,
			`volume "bad" of kind iscsi: no volume plugin handles it`},
		{"gitRepo", v1.Volume{Name: "bad", VolumeSource: v1.VolumeSource{GitRepo: &v1.GitRepoVolumeSource{Repository: "https://example.com/repo.git"}}}, true,
			`volume "bad" of kind gitRepo: no volume plugin handles it`},
		{"emptyDir of an invalid medium", emptyDirVolume("bad", "Floppy", ""), true,
			`unknown storage medium "Floppy"`},
	} {
		pod := kindsPod(fmt.Sprintf("bad-%d", i), c.vol)
		err := waitCause(t, e.ctx, vm, pod, c.cause, c.final)
		if err == nil {
			t.Errorf("%s: the pod's volumes were mounted", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, s := range []string{"pod " + kindsNS + "/" + pod.Name, `volume "bad"`, c.cause} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error does not say %s: %v", c.name, s, err)
			}
		}
		if got := errors.Is(err, volumemanager.ErrFinal); got != c.final {
			t.Errorf("%s: final %v, want %v: %v", c.name, got, c.final, err)
		}
		if !c.final && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: the wait did not run out: %v", c.name, err)
		}
		e.checkMounts(c.name, nil)
		e.checkTree(c.name, nil)
		deletePods(t, e.ctx, vm, []*v1.Pod{pod})
	}
	checkFile(t, "the file named as a directory", file, "a file\n")
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want it still missing", missing, err)
	}
	if entries, err := os.ReadDir(otherDir); err != nil || len(entries) > 0 {
		t.Errorf("the other node's local PV %s: %v, %v; want it empty", otherDir, entries, err)
	}
	e.checkTree("all bad pods deleted", nil)
}

// waitCause waits for the pod's volumes: until a final error, or, when
// the error is not final, until the error names cause, asking again with
// short waits that run out.
func waitCause(t *testing.T, ctx context.Context, vm *volumemanager.VolumeManager, pod *v1.Pod, cause string, final bool) error {
	t.Helper()
	if final {
		ctx, done := context.WithTimeout(ctx, time.Minute)
		defer done()
		return vm.WaitForAttachAndMount(ctx, pod)
	}
	var err error
	waitFor(t, fmt.Sprintf("pod %s's wait error to name %s", pod.Name, cause), time.Minute, func() bool {
		ctx, done := context.WithTimeout(ctx, 200*time.Millisecond)
		defer done()
		err = vm.WaitForAttachAndMount(ctx, pod)
		return err == nil || strings.Contains(err.Error(), cause)
	})
	return err
}
