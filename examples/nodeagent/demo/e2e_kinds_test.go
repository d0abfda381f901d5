package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/subpath"
	"github.com/nodevol/nodevol/volumemanager"
)

// allKinds is a pod with one volume of each kind, its container's subPath
// mounts, and what it should get.
type allKinds struct {
	pod              *v1.Pod
	hostDir          string // the hostPath volume's path (DirectoryOrCreate)
	localPV          string // the local PV's (and its claim's) name
	localDir         string // the local PV's directory
	csiSub, emptySub int    // the subPath volumeMounts' indexes
}

// newAllKinds makes the pod name with an emptyDir on disk ("scratch"), an
// emptyDir in memory of 64Mi ("mem"), a hostPath DirectoryOrCreate
// ("host", whose parent is missing too), a claim of a new local PV
// ("local"), an image volume ("img") and the CSI claim ("data"), and
// subPath volumeMounts of "data" and "scratch".
func (e *kindsEnv) newAllKinds(name string) *allKinds {
	a := &allKinds{
		hostDir:  filepath.Join(e.host, "hostpath-"+name, "dir"),
		localPV:  "local-" + name,
		localDir: filepath.Join(e.host, "local-"+name),
	}
	e.localClaim(a.localPV, a.localDir, kindsNode)
	a.pod = kindsPod(name,
		emptyDirVolume("scratch", v1.StorageMediumDefault, ""),
		emptyDirVolume("mem", v1.StorageMediumMemory, "64Mi"),
		hostPathVolume("host", a.hostDir, v1.HostPathDirectoryOrCreate),
		claimVolume("local", a.localPV),
		imageVolume("img"),
		claimVolume("data", kindsCSIClaim))
	a.csiSub = withSubPath(a.pod, "data", "sub/csi")
	a.emptySub = withSubPath(a.pod, "scratch", "sub/scratch")
	return a
}

// volumes is what GetMountedVolumesForPod must say of the pod.
func (e *kindsEnv) volumes(a *allKinds) map[string]wantVolume {
	return map[string]wantVolume{
		"scratch": {plugin: "kubernetes.io/empty-dir", path: e.volumePath(a.pod, "kubernetes.io~empty-dir", "scratch"), dirName: "scratch"},
		"mem":     {plugin: "kubernetes.io/empty-dir", path: e.volumePath(a.pod, "kubernetes.io~empty-dir", "mem"), dirName: "mem"},
		"host":    {plugin: "kubernetes.io/host-path", path: a.hostDir, dirName: "host"},
		"local":   {plugin: "kubernetes.io/local-volume", path: e.volumePath(a.pod, "kubernetes.io~local-volume", a.localPV), dirName: a.localPV},
		"img":     {plugin: "kubernetes.io/image", dirName: "img", byRuntime: true},
		"data":    {plugin: "kubernetes.io/csi", path: e.csiTarget(a.pod), dirName: e.csiPV.Name, driver: e.drv.name},
	}
}

// mounts is the pod's mounts under the root, without the CSI volume's
// staging mount; with subPaths, its subPath bind mounts too.
func (e *kindsEnv) mounts(a *allKinds, loop string, subPaths bool) map[string]wantMount {
	w := e.volumes(a)
	m := map[string]wantMount{
		e.csiTarget(a.pod): {fstype: "ext4", dev: loop},
		w["mem"].path:      {fstype: "tmpfs", opt: "size=65536k"}, // 64Mi exactly
		w["local"].path:    {same: a.localDir},
	}
	if subPaths {
		m[e.subPathTarget(a.pod, e.csiPV.Name, a.csiSub)] = wantMount{dev: loop, same: filepath.Join(w["data"].path, "sub/csi")}
		m[e.subPathTarget(a.pod, "scratch", a.emptySub)] = wantMount{same: filepath.Join(w["scratch"].path, "sub/scratch")}
	}
	return m
}

// layout is what the pod has under the root while mounted (relative to
// the root; see checkTree), with its data files and, with subPaths, the
// subPath directories and targets.
func (e *kindsEnv) layout(a *allKinds, subPaths bool) []string {
	pod := "pods/" + string(a.pod.UID)
	csiDir := pod + "/volumes/kubernetes.io~csi/" + e.csiPV.Name
	out := []string{
		csiDir + "/mount/", csiDir + "/vol_data.json", ondisk.RecordFile(csiDir),
		pod + "/volumes/kubernetes.io~empty-dir/scratch/data",
		pod + "/volumes/kubernetes.io~empty-dir/mem/",
		pod + "/plugins/kubernetes.io~empty-dir/scratch/ready",
		pod + "/plugins/kubernetes.io~empty-dir/mem/ready",
		pod + "/volumes/kubernetes.io~local-volume/" + a.localPV + "/",
	}
	if subPaths {
		out = append(out, pod+"/volumes/kubernetes.io~empty-dir/scratch/sub/scratch/data",
			rel(e.root, e.subPathTarget(a.pod, e.csiPV.Name, a.csiSub))+"/",
			rel(e.root, e.subPathTarget(a.pod, "scratch", a.emptySub))+"/")
	}
	return out
}

// staged is the CSI volume's staging directory under the root.
func (e *kindsEnv) staged() []string {
	dir := rel(e.root, filepath.Dir(e.csiStaging()))
	return []string{dir + "/globalmount/", dir + "/vol_data.json", ondisk.RecordFile(dir)}
}

// mountAll adds the pod and waits for its volumes.
func (e *kindsEnv) mountAll(vm *volumemanager.VolumeManager, pod *v1.Pod) {
	e.t.Helper()
	if err := vm.AddPod(pod); err != nil {
		e.t.Fatal(err)
	}
	ctx, done := context.WithTimeout(e.ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
}

// useAll writes a file named data into each of the pod's volumes that
// has a path, and checks where it landed: on the tmpfs, on the CSI
// volume's loop device, in the local PV's directory, at the host path.
func (e *kindsEnv) useAll(a *allKinds, loop string) {
	t := e.t
	t.Helper()
	w := e.volumes(a)
	for _, name := range []string{"scratch", "mem", "host", "local", "data"} {
		writeFile(t, filepath.Join(w[name].path, "data"), "data of "+name+"\n")
	}
	checkFile(t, "host path", filepath.Join(a.hostDir, "data"), "data of host\n")
	checkFile(t, "local PV", filepath.Join(a.localDir, "data"), "data of local\n")
	if dev := deviceOf(t, filepath.Join(w["data"].path, "data")); dev != loop {
		t.Errorf("the CSI volume's file is on device %s, want %s (its loop device)", dev, loop)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(w["mem"].path, "data"), &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Errorf("the memory emptyDir's file: on a filesystem of type %#x, %v; want a tmpfs", st.Type, err)
	}
}

// deviceOf is the device ("major:minor") path is on.
func deviceOf(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}

// checkOwnership checks the fsGroup: the emptyDirs' and the local
// volume's roots and files are the pod's group, set-group-ID directories;
// the host path is left as it was made (mode 0755, root's group).
func (e *kindsEnv) checkOwnership(a *allKinds) {
	t := e.t
	t.Helper()
	w := e.volumes(a)
	for _, name := range []string{"scratch", "mem", "local"} {
		for _, p := range []string{w[name].path, filepath.Join(w[name].path, "data")} {
			mode, gid := statGroup(t, p)
			if gid != kindsFSGroup || (mode.IsDir() && mode&os.ModeSetgid == 0) {
				t.Errorf("volume %q: %s: mode %v, group %d; want group %d (fsGroup), set-group-ID if a directory", name, p, mode, gid, kindsFSGroup)
			}
		}
	}
	if mode, gid := statGroup(t, a.hostDir); !mode.IsDir() || mode.Perm() != 0o755 || gid != 0 {
		t.Errorf("host path %s: mode %v, group %d; want a directory of mode 0755 made by DirectoryOrCreate, group 0 (no fsGroup for a hostPath)", a.hostDir, mode, gid)
	}
}

// subPathMount is one volumeMount with a subPath of a pod's container.
type subPathMount struct {
	volume, sub string
	index       int
}

// subPaths are the pod's subPath mounts.
func (a *allKinds) subPaths() []subPathMount {
	return []subPathMount{{"data", "sub/csi", a.csiSub}, {"scratch", "sub/scratch", a.emptySub}}
}

// prepareSubPaths prepares the pod's subPath mounts as a runtime would,
// with the volumes' DirName, and writes through them.
func (e *kindsEnv) prepareSubPaths(vm *volumemanager.VolumeManager, pod *v1.Pod, mounts []subPathMount) {
	t := e.t
	t.Helper()
	vols := map[string]podvol.MountedVolume{}
	for _, v := range vm.GetMountedVolumesForPod(pod.UID) {
		vols[v.SpecName] = v
	}
	for _, s := range mounts {
		v := vols[s.volume]
		got, err := vm.SubPaths().Prepare(e.ctx, subpath.Mount{Pod: pod.UID, Volume: v.DirName, VolumePath: v.Path, Container: kindsContainer, Index: s.index, SubPath: s.sub})
		if err != nil {
			t.Fatal(err)
		}
		if want := e.subPathTarget(pod, v.DirName, s.index); got != want {
			t.Errorf("subPath %q of volume %q: prepared at %s, want %s", s.sub, s.volume, got, want)
		}
		writeFile(t, filepath.Join(got, "data"), "subPath data of "+s.volume+"\n")
		checkFile(t, "subPath", filepath.Join(v.Path, s.sub, "data"), "subPath data of "+s.volume+"\n")
	}
}

// opCounts counts the volume manager's operations by "plugin operation
// status", from its storage_operation_duration_seconds.
func opCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "storage_operation_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["volume_plugin"]+" "+l["operation_name"]+" "+l["status"]] += m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// failedOps lists the operations that failed.
func failedOps(counts map[string]uint64) []string {
	var out []string
	for k, n := range counts {
		if !strings.HasSuffix(k, " success") {
			out = append(out, fmt.Sprintf("%s x%d", k, n))
		}
	}
	slices.Sort(out)
	return out
}

// TestAllKindsEndToEnd mounts one pod with a volume of every kind, and a
// second pod with the volumes whose content nodevol writes (two configMaps,
// a secret, a downwardAPI volume and the kube-api-access projected volume),
// checks what the volume manager reports, the mount table (the tmpfs
// mounts of the secret, downwardAPI and projected volumes of the pod's
// memory limit), the loop device, the tree under the root, where data
// lands, the fsGroup, the content volumes' files, links, modes and owners,
// and the one TokenRequest; prepares subPath
// mounts of the CSI volume and the emptyDir; deletes the pod: the subPath
// mounts go before the volumes are unpublished (the CSI volume unstages
// at the first attempt: no operation fails), nothing is left mounted or
// attached, the emptyDirs go with their ready files (the wrapped ones too),
// the pods' volume directories go, the local PV's and the host path's data
// stay.
func TestAllKindsEndToEnd(t *testing.T) {
	e := newKindsEnv(t, "nv-kinds-")
	tokens := e.contentObjects()
	vm, reg, _ := e.start()
	a, c := e.newAllKinds("all"), newContentPod("content")

	e.mountAll(vm, a.pod)
	e.mountAll(vm, c)
	checkVolumes(t, vm.GetMountedVolumesForPod(a.pod.UID), e.volumes(a))
	checkVolumes(t, vm.GetMountedVolumesForPod(c.UID), e.contentVolumes(c))
	loop := e.loopDev("mounted", true)
	want := merge(e.mounts(a, loop, false), e.contentMounts(c))
	want[e.csiStaging()] = wantMount{fstype: "ext4", dev: loop}
	e.checkMounts("mounted", want)
	e.useAll(a, loop)
	e.checkOwnership(a)
	e.checkContent("mounted", c, contentFiles("1", "hunter2", contentLabels, "token-1"), &contentVersions{})
	checkTokenRequests(t, tokens.issued(), c)
	e.checkTree("mounted", slices.Concat(e.layout(a, false), e.staged(), e.contentLayout(c, nil)))

	e.prepareSubPaths(vm, a.pod, a.subPaths())
	want = merge(e.mounts(a, loop, true), e.contentMounts(c))
	want[e.csiStaging()] = wantMount{fstype: "ext4", dev: loop}
	e.checkMounts("subPaths prepared", want)
	e.checkTree("subPaths prepared", slices.Concat(e.layout(a, true), e.staged(), e.contentLayout(c, nil)))

	deletePods(t, e.ctx, vm, []*v1.Pod{a.pod, c})
	if err := waitUnstaged(e.ctx, vm); err != nil {
		t.Fatal(err)
	}
	ops := opCounts(t, reg)
	t.Logf("operations: %v", ops)
	if failed := failedOps(ops); len(failed) > 0 {
		t.Errorf("operations failed (retried): %v", failed)
	}
	csiOps := "kubernetes.io/csi:" + e.drv.name
	for _, op := range []string{"volume_unmount", "unmount_device"} {
		if n := ops[csiOps+" "+op+" success"]; n != 1 {
			t.Errorf("the CSI volume's %s: %d times, want once", op, n)
		}
	}
	e.checkMounts("deleted", nil)
	e.loopDev("deleted", false)
	e.checkTree("deleted", slices.Concat(e.skeleton(a.pod, true), e.unstaged(), contentSkeleton(c)))
	checkFile(t, "host path after the pod", filepath.Join(a.hostDir, "data"), "data of host\n")
	checkFile(t, "local PV after the pod", filepath.Join(a.localDir, "data"), "data of local\n")
}

// skeleton is what stays under the root of a pod whose volumes are gone:
// its directories of each plugin (a pod's own directory is the node
// agent's housekeeping to remove, as the kubelet's is: the volume manager
// removes each volume's directory, not its plugin's) and, with a CSI
// volume, the hashed directory of nodevol's record of its publish, empty.
func (e *kindsEnv) skeleton(pod *v1.Pod, csi bool) []string {
	dir := "pods/" + string(pod.UID)
	out := []string{dir + "/plugins/kubernetes.io~empty-dir/", dir + "/volumes/kubernetes.io~empty-dir/", dir + "/volumes/kubernetes.io~local-volume/"}
	if csi {
		out = append(out, dir+"/volumes/kubernetes.io~csi/", filepath.Dir(ondisk.RecordFile(dir+"/volumes/kubernetes.io~csi/"+e.csiPV.Name))+"/")
	}
	return out
}

// unstaged is what stays under the root of the CSI volume once it is
// unstaged: the CSI plugin's directory and the hashed directory of
// nodevol's record of its stage, empty.
func (e *kindsEnv) unstaged() []string {
	staging := rel(e.root, filepath.Dir(e.csiStaging()))
	return []string{"plugins/kubernetes.io/csi/" + e.drv.name + "/", filepath.Dir(ondisk.RecordFile(staging)) + "/"}
}
