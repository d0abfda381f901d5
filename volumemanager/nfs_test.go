package volumemanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// nfsMounts lists the fake mount table's nfs mounts as "device -> path
// [options]", paths relative to root.
func nfsMounts(m *mount.FakeMounter, root string) []string {
	mps, _ := m.List()
	var out []string
	for _, mp := range mps {
		if mp.Type == "nfs" {
			out = append(out, fmt.Sprintf("%s -> %s %v", mp.Device, strings.TrimPrefix(mp.Path, root+"/"), mp.Opts))
		}
	}
	slices.Sort(out)
	return out
}

// TestNFSVolumes: a pod's inline nfs volume and its claims bound to nfs
// PVs resolve to the nfs plugin and are mounted through the mounter with
// the kubelet's source, type and options (the pod's readOnly, the PV's
// mountOptions, or its mount-options annotation instead, an IPv6 server
// bracketed), under pod-scoped names; the pod's containers get them
// read-only where the kubelet would; they go with the pod.
func TestNFSVolumes(t *testing.T) {
	m := mount.NewFakeMounter(nil)
	e := newEnv(t, envOptions{mounter: m})
	e.inTreeClaim("home", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "fd00::5", Path: "/exports/home"}}, csitest.PVSpec{}, func(pv *v1.PersistentVolume) {
		pv.Spec.MountOptions = []string{"nfsvers=4.1", "hard"}
	})
	e.inTreeClaim("legacy", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/legacy"}}, csitest.PVSpec{}, func(pv *v1.PersistentVolume) {
		pv.Spec.MountOptions = []string{"soft"}
		pv.Annotations = map[string]string{v1.MountOptionAnnotation: "nfsvers=3,,hard"}
	})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "share", Source: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "10.0.0.5", Path: "/exports/share", ReadOnly: true}}},
		{Name: "home", Claim: "home"},
		{Name: "legacy", Claim: "legacy", ReadOnly: true},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := "pods/" + string(pod.UID) + "/volumes/kubernetes.io~nfs/"
	home, legacy := pvNameOf(t, e, "home"), pvNameOf(t, e, "legacy")
	want := []string{
		"10.0.0.5:/exports/share -> " + dir + "share [ro]",
		"[fd00::5]:/exports/home -> " + dir + home + " [hard nfsvers=4.1]",
		"nfs.example:/legacy -> " + dir + legacy + " [hard nfsvers=3 ro]",
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, nfsMounts(m, e.root)); diff != "" {
		t.Errorf("nfs mounts (-want +got):\n%s", diff)
	}
	got := map[string]podvol.MountedVolume{}
	for _, v := range e.vm.GetMountedVolumesForPod(pod.UID) {
		got[v.SpecName] = v
	}
	for _, w := range []struct {
		spec, dir string
		ro        bool
	}{{"share", "share", true}, {"home", home, false}, {"legacy", legacy, true}} {
		v := got[w.spec]
		wantName := podvol.UniqueVolumeName("kubernetes.io/nfs/" + string(pod.UID) + "-" + w.dir)
		if v.Name != wantName || v.Plugin != "kubernetes.io/nfs" || v.Path != filepath.Join(e.root, dir, w.dir) || v.ReadOnly != w.ro {
			t.Errorf("mounted %s = %+v; want %s at %s, read-only %v", w.spec, v, wantName, filepath.Join(e.root, dir, w.dir), w.ro)
		}
	}
	for _, n := range e.vm.GetVolumesInUse() {
		if strings.HasPrefix(string(n), "kubernetes.io/nfs/") {
			t.Errorf("GetVolumesInUse lists %s: an nfs volume is not attached, the kubelet does not report it", n)
		}
	}
	e.unmount(pod)
	if left := nfsMounts(m, e.root); len(left) != 0 {
		t.Errorf("nfs mounts after the pod went: %v", left)
	}
	if entries, err := os.ReadDir(filepath.Join(e.root, dir)); err == nil && len(entries) != 0 {
		t.Errorf("pod volume directories left: %v", entries)
	}
}

// pvNameOf is the name of the PV claim is bound to.
func pvNameOf(t *testing.T, e *env, claim string) string {
	t.Helper()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc.Spec.VolumeName
}

// failingNFS is a fake mounter whose nfs mounts fail as mount.nfs does
// when the server does not answer.
type failingNFS struct {
	*mount.FakeMounter
	tries atomic.Int32
}

func (m *failingNFS) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	if fstype != "nfs" {
		return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
	}
	m.tries.Add(1)
	return errors.New("mount failed: exit status 32\nOutput: mount.nfs: Connection timed out")
}

// TestNFSMountFailure: an nfs mount that fails leaves nothing under the
// pod's directory; the wait's error names the pod, the volume, the server
// and the cause; the pod's event is the kubelet's, with the mounter's
// words.
func TestNFSMountFailure(t *testing.T) {
	m := &failingNFS{FakeMounter: mount.NewFakeMounter(nil)}
	e := newEnv(t, envOptions{mounter: m})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "share", Source: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/exports/share"}}},
	}})
	e.vm.AddPod(pod)
	eventually(t, "a failed nfs mount", func() bool { return m.tries.Load() > 0 })
	err := e.mount(pod, 300*time.Millisecond)
	if err == nil {
		t.Fatal("WaitForAttachAndMount succeeded")
	}
	for _, want := range []string{"pod ns/web", `nfs volume "share" (server nfs.example, path /exports/share)`, "mount.nfs: Connection timed out"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("wait error %q does not say %q", err, want)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~nfs")); err == nil && len(entries) != 0 {
		t.Errorf("a failed mount left %v", entries)
	}
	if mps, _ := m.List(); len(mps) != 0 {
		t.Errorf("mounts left: %v", mps)
	}
	const event = `Warning FailedMount MountVolume.SetUp failed for volume "share" : mount failed: exit status 32` + "\nOutput: mount.nfs: Connection timed out"
	eventually(t, "the FailedMount event", func() bool {
		for {
			select {
			case ev := <-e.events.Events:
				if ev == event {
					return true
				}
			default:
				return false
			}
		}
	})
}

// TestNFSAfterRestart: after a restart the pod's nfs mounts are found on
// disk and in the mount table, Mounted, under the names the pod resolves
// to: the pod added again mounts nothing more; the pod deleted while the
// manager was down is unmounted and its directory removed.
func TestNFSAfterRestart(t *testing.T) {
	m := mount.NewFakeMounter(nil)
	e := newEnv(t, envOptions{mounter: m})
	share := v1.Volume{Name: "share", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/exports/share"}}}
	kept, gone := csitest.Pod("ns", "kept", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: share.Name, Source: share.VolumeSource},
	}}), csitest.Pod("ns", "gone", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: share.Name, Source: share.VolumeSource}}})
	for _, pod := range []*v1.Pod{kept, gone} {
		if err := e.mount(pod, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	e.stop()
	m.ResetLog()

	e2 := newEnv(t, envOptions{root: e.root, mounter: m})
	eventually(t, "reconstruction", e2.vm.statesSynced.Load)
	for _, pod := range []*v1.Pod{kept, gone} {
		name := podvol.UniqueVolumeName("kubernetes.io/nfs/" + string(pod.UID) + "-share")
		if v, ok := e2.vm.asw.Volume(name); !ok || v.Pods[pod.UID].State != podvol.Mounted {
			t.Errorf("found on disk: %s = %+v, %v; want Mounted", name, v, ok)
		}
	}
	if err := e2.mount(kept, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e2.vm.MarkPodsSynced()
	goneDir := filepath.Join(e.root, "pods", string(gone.UID), "volumes", "kubernetes.io~nfs", "share")
	eventually(t, "the deleted pod's nfs volume torn down", func() bool {
		_, err := os.Lstat(goneDir)
		return errors.Is(err, os.ErrNotExist)
	})
	for _, a := range m.GetLog() {
		if a.Action == mount.FakeActionMount {
			t.Errorf("mounted again after the restart: %+v", a)
		}
	}
	if got := nfsMounts(m, e.root); len(got) != 1 || !strings.Contains(got[0], string(kept.UID)) {
		t.Errorf("nfs mounts = %v, want the kept pod's only", got)
	}
}
