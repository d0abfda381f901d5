package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/subpath"
	"github.com/nodevol/nodevol/volumemanager"
)

// The root end-to-end tests of every kind of volume nodevol handles, side
// by side in one pod: an emptyDir on disk, an emptyDir in memory (a
// tmpfs), a hostPath, a claim bound to a local PV (a directory), an image
// volume and a claim bound to a CSI volume of the loop driver (ext4 on a
// loop device). They check the mount table under the root, the loop
// devices, the directories and the files exactly.

const (
	kindsNode    = "node-1"
	kindsNS      = "demo"
	kindsFSGroup = 2000
	// kindsCSIClaim is the CSI claim provision makes (its first).
	kindsCSIClaim = "demo-0"
	// kindsContainer is csitest.Pod's container.
	kindsContainer = "app"
)

// kindsEnv is a node for these tests: the loop driver on a new root, a
// fake API server with this node's Node (its hostname label, 8Gi of
// allocatable memory), the loop driver's CSIDriver and one CSI claim, and
// a directory outside the root for the host paths and local PVs.
type kindsEnv struct {
	t      *testing.T
	ctx    context.Context
	root   string
	host   string
	drv    *demoDriver
	client *fake.Clientset
	csiPV  *v1.PersistentVolume
	// resync, if set, is the volume managers' ResyncPeriod: an hour makes
	// a test show that a change lands through its event, not a resync.
	resync time.Duration
}

func newKindsEnv(t *testing.T, prefix string) *kindsEnv {
	t.Helper()
	roottest.Require(t)
	host := t.TempDir() // made before the root: removed after its clean-up
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	root, drv := startE2E(t, ctx, prefix, kindsNode)
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: kindsNode, Labels: map[string]string{v1.LabelHostname: kindsNode}},
		Status:     v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi")}},
	}
	e := &kindsEnv{t: t, ctx: ctx, root: root, host: host, drv: drv,
		client: fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}), node)}
	if _, err := provision(ctx, e.client, drv, 1, kindsNode); err != nil {
		t.Fatal(err)
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(kindsNS).Get(ctx, kindsCSIClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e.csiPV, err = e.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// start starts a volume manager on the root, with its own metrics
// registry, and registers the loop driver with it; stop ends it.
func (e *kindsEnv) start() (vm *volumemanager.VolumeManager, reg *prometheus.Registry, stop func()) {
	e.t.Helper()
	reg = prometheus.NewRegistry()
	cfg := volumemanager.Config{NodeName: kindsNode, KubeClient: e.client, RootDir: e.root, Mounter: e.drv.mounter, Registerer: reg, ResyncPeriod: e.resync}
	vm, stop = startVolumeManager(e.t, e.ctx, cfg, e.drv.name, e.drv.endpoint)
	return vm, reg, stop
}

// localClaim makes a local PV of the directory dir (made here, mode 0755)
// whose node affinity names node by its hostname label, and a claim of
// the same name bound to it.
func (e *kindsEnv) localClaim(name, dir, node string) {
	e.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	pvc := csitest.PVC(kindsNS, name, name)
	fsMode := v1.PersistentVolumeFilesystem
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			VolumeMode:                    &fsMode,
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			StorageClassName:              "local",
			PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: dir}},
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: kindsNS, Name: name, UID: pvc.UID},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
	if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.CoreV1().PersistentVolumeClaims(kindsNS).Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// Pod volumes, by kind.

func imageVolume(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{
		Reference: "registry.k8s.io/pause:3.10", PullPolicy: v1.PullIfNotPresent}}}
}

// kindsPod is a pod of the node with the volumes, each mounted by its
// container, and the fsGroup kindsFSGroup.
func kindsPod(name string, vols ...v1.Volume) *v1.Pod {
	gid := int64(kindsFSGroup)
	spec := csitest.PodSpec{Node: kindsNode, FSGroup: &gid}
	for _, v := range vols {
		spec.Volumes = append(spec.Volumes, csitest.PodVolume{Name: v.Name, Source: v.VolumeSource})
	}
	return csitest.Pod(kindsNS, name, spec)
}

// withSubPath adds to the pod's container a volumeMount of volume with a
// subPath, and returns its index.
func withSubPath(pod *v1.Pod, volume, sub string) int {
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: volume, MountPath: "/sub/" + volume, SubPath: sub})
	return len(c.VolumeMounts) - 1
}

// Where things are under the root: the kubelet's layout.

func (e *kindsEnv) podDir(pod *v1.Pod) string { return filepath.Join(e.root, "pods", string(pod.UID)) }

func (e *kindsEnv) volumePath(pod *v1.Pod, plugin, dir string) string {
	return filepath.Join(e.podDir(pod), "volumes", plugin, dir)
}

func (e *kindsEnv) csiTarget(pod *v1.Pod) string {
	return filepath.Join(e.volumePath(pod, "kubernetes.io~csi", e.csiPV.Name), "mount")
}

func (e *kindsEnv) csiStaging() string {
	sum := sha256.Sum256([]byte(e.csiPV.Spec.CSI.VolumeHandle))
	return filepath.Join(e.root, "plugins", "kubernetes.io", "csi", e.drv.name, hex.EncodeToString(sum[:]), "globalmount")
}

// csiImage is the loop driver's image of the CSI volume.
func (e *kindsEnv) csiImage() string {
	return filepath.Join(e.root, "loopdriver", "volumes", e.csiPV.Spec.CSI.VolumeHandle+".img")
}

func (e *kindsEnv) subPathTarget(pod *v1.Pod, dirName string, index int) string {
	return filepath.Join(e.podDir(pod), subpath.DirName, dirName, kindsContainer, fmt.Sprint(index))
}

// wantVolume is what GetMountedVolumesForPod says of one pod volume.
type wantVolume struct {
	plugin, path, dirName, driver string
	byRuntime                     bool
	// readOnly: the volume is read-only to every container (configMap,
	// secret, downwardAPI, projected).
	readOnly bool
}

// checkVolumes compares GetMountedVolumesForPod with want, by spec name.
func checkVolumes(t *testing.T, got []podvol.MountedVolume, want map[string]wantVolume) {
	t.Helper()
	seen := map[string]bool{}
	for _, v := range got {
		seen[v.SpecName] = true
		w, ok := want[v.SpecName]
		if !ok {
			t.Errorf("mounted volume %q (%s): not in the pod", v.SpecName, v.Plugin)
			continue
		}
		g := wantVolume{plugin: v.Plugin, path: v.Path, dirName: v.DirName, driver: v.Driver, byRuntime: v.ProvidedByRuntime, readOnly: v.ReadOnly}
		if g != w || v.Block || v.State != podvol.Mounted {
			t.Errorf("mounted volume %q: %+v (block %v, state %v); want %+v, a filesystem, mounted", v.SpecName, g, v.Block, v.State, w)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("volume %q: not among the mounted volumes", name)
		}
	}
}

// wantMount is what one mount point under the root must show; every
// mount under the root must be wanted, exactly once.
type wantMount struct {
	fstype string // "" for a bind mount, whose type is its source's
	// same is the file the mount must show (device and inode of its
	// root), for a bind mount.
	same string
	// dev is the device ("major:minor") it must be of, for the CSI mounts.
	dev string
	// opt is a super option it must have (a tmpfs's size).
	opt string
}

// kindsMountsUnder lists the mounts under root, by mount point.
func kindsMountsUnder(t *testing.T, root string) map[string][]mount.MountInfo {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]mount.MountInfo{}
	for _, mi := range infos {
		if strings.HasPrefix(mi.MountPoint, root+"/") {
			out[mi.MountPoint] = append(out[mi.MountPoint], mi)
		}
	}
	return out
}

// checkMounts compares the mounts under the root with want and returns
// each one's mount ID.
func (e *kindsEnv) checkMounts(label string, want map[string]wantMount) map[string]int {
	t := e.t
	t.Helper()
	ids := map[string]int{}
	got := kindsMountsUnder(t, e.root)
	for p, ms := range got {
		w, ok := want[p]
		switch {
		case !ok:
			t.Errorf("%s: %s: %d mounts (%s), want none", label, rel(e.root, p), len(ms), ms[0].FsType)
			continue
		case len(ms) != 1:
			t.Errorf("%s: %s: %d mounts, want 1", label, rel(e.root, p), len(ms))
			continue
		}
		m := ms[0]
		ids[p] = m.ID
		if w.fstype != "" && m.FsType != w.fstype {
			t.Errorf("%s: %s: a %s mount, want %s", label, rel(e.root, p), m.FsType, w.fstype)
		}
		if dev := fmt.Sprintf("%d:%d", m.Major, m.Minor); w.dev != "" && dev != w.dev {
			t.Errorf("%s: %s: of device %s, want %s", label, rel(e.root, p), dev, w.dev)
		}
		if w.opt != "" && !slices.Contains(m.SuperOptions, w.opt) {
			t.Errorf("%s: %s: super options %v, want %s among them", label, rel(e.root, p), m.SuperOptions, w.opt)
		}
		if w.same != "" && !sameFile(t, p, w.same) {
			t.Errorf("%s: %s: does not show %s", label, rel(e.root, p), w.same)
		}
	}
	for p := range want {
		if _, ok := got[p]; !ok {
			t.Errorf("%s: %s: not mounted", label, rel(e.root, p))
		}
	}
	return ids
}

// sameFile reports whether a and b are the same file (device and inode).
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}

// loopDev is the device ("major:minor") of the single loop device on the
// CSI volume's image, when want is true; with want false, it checks that
// no loop device is bound to a file under the root.
func (e *kindsEnv) loopDev(label string, want bool) string {
	e.t.Helper()
	loops := loopDevicesUnder(e.t, e.root)
	if !want {
		if len(loops) > 0 {
			e.t.Errorf("%s: loop devices on files under the root: %v", label, loops)
		}
		return ""
	}
	devs := loops[e.csiImage()]
	if len(loops) != 1 || len(devs) != 1 {
		e.t.Fatalf("%s: loop devices %v, want one on %s", label, loops, rel(e.root, e.csiImage()))
	}
	return devs[0].dev
}

// harness are the test's own entries under the root (the loop driver's
// state, socket and log), which the tree checks do not look into.
func (e *kindsEnv) harness() []string {
	return []string{"loopdriver", "loopdriver.log", "plugins/" + e.drv.name}
}

// tree lists what is under the root, relative to it, directories with a
// trailing slash, without the harness's entries and without looking into
// mount points.
func (e *kindsEnv) tree() []string {
	t := e.t
	t.Helper()
	mounts := kindsMountsUnder(t, e.root)
	var out []string
	err := filepath.WalkDir(e.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == e.root {
			return nil
		}
		r := rel(e.root, p)
		if slices.Contains(e.harness(), r) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			out = append(out, r+"/")
			if len(mounts[p]) > 0 {
				return filepath.SkipDir
			}
			return nil
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// checkTree compares tree() with want (relative paths, directories with a
// trailing slash; their parents are added, and the harness's).
func (e *kindsEnv) checkTree(label string, want []string) {
	e.t.Helper()
	set := map[string]bool{"plugins/": true} // the parent of the driver's socket directory
	for _, w := range want {
		set[w] = true
		for d := filepath.Dir(strings.TrimSuffix(w, "/")); d != "."; d = filepath.Dir(d) {
			set[d+"/"] = true
		}
	}
	var all []string
	for w := range set {
		all = append(all, w)
	}
	slices.Sort(all)
	if got := e.tree(); !slices.Equal(got, all) {
		e.t.Errorf("%s: under the root:\n  %s\nwant:\n  %s", label, strings.Join(got, "\n  "), strings.Join(all, "\n  "))
	}
}

// stat returns path's mode and group.
func statGroup(t *testing.T, path string) (fs.FileMode, uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid
}

// writeFile writes data to path, failing the test on error.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkFile checks that path holds data.
func checkFile(t *testing.T, label, path, data string) {
	t.Helper()
	if got, err := os.ReadFile(path); err != nil || string(got) != data {
		t.Errorf("%s: %s: %q, %v; want %q", label, path, got, err, data)
	}
}
