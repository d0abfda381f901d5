package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/emptydir"
	"github.com/nodevol/nodevol/volume/subpath"
)

// The crash-point scenarios of the volume kinds besides CSI (emptyDir on
// disk and in memory, local PVs) and of the subPath bind mounts made in a
// CSI volume, with what the pods' containers do once their volumes are
// mounted (runContainers) and the fake mounter's bind of an opened file
// (fdBinder), which subPath mounts are; and what the scenarios do beside
// adding and deleting pods (resize).
//
// hostPath is not among them: its only step is creating the host path of
// a DirectoryOrCreate or FileOrCreate volume, outside the root, where
// crashNode.state does not look, and it leaves nothing under the root or
// in the mount table; its teardown takes no step at all.

// kindScenarios are the scenarios of the kinds besides CSI and of subPath
// mounts; claim, add and del are crashScenarios'.
func kindScenarios(claim func(string, string) []runtime.Object, add, del func(*v1.Pod) func(*VolumeManager, *crashNode)) []crashScenario {
	disk := csitest.Pod("ns", "scratch", csitest.PodSpec{Volumes: []csitest.PodVolume{withEmptyDir("scratch", "")}})
	mem := csitest.Pod("ns", "mem", csitest.PodSpec{Volumes: []csitest.PodVolume{withEmptyDir("cache", v1.StorageMediumMemory)}})
	lp := csitest.Pod("ns", "lp", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "local"}}})
	sp := withSubPath(csitest.Pod("ns", "sp", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "vol"},
	}}), "data", "app.conf")
	opts := csitest.Options{CreateTargetDirs: true}
	none := func(string, string) []runtime.Object { return nil }
	return []crashScenario{
		{name: "emptydir-setup", opts: opts, objects: none, after: []*v1.Pod{disk}, act: add(disk)},
		{name: "emptydir-teardown", opts: opts, objects: none, before: []*v1.Pod{disk}, other: []*v1.Pod{disk}, act: del(disk)},
		{name: "emptydir-memory-setup", opts: opts, objects: none, node: crashNodeObject(), after: []*v1.Pod{mem}, act: add(mem)},
		{name: "emptydir-memory-teardown", opts: opts, objects: none, node: crashNodeObject(), before: []*v1.Pod{mem}, other: []*v1.Pod{mem}, act: del(mem)},
		{name: "local-setup", opts: opts, objects: localClaim, hostDirs: []string{"local"}, node: crashNodeObject(), after: []*v1.Pod{lp}, act: add(lp)},
		{name: "local-teardown", opts: opts, objects: localClaim, hostDirs: []string{"local"}, node: crashNodeObject(),
			before: []*v1.Pod{lp}, other: []*v1.Pod{lp}, act: del(lp)},
		{name: "subpath-clean-unpublish", opts: opts, objects: claim, before: []*v1.Pod{sp}, other: []*v1.Pod{sp}, act: del(sp)},
	}
}

// withEmptyDir adds an emptyDir of medium to the pod and mounts it.
func withEmptyDir(name string, medium v1.StorageMedium) csitest.PodVolume {
	return csitest.PodVolume{Name: name, Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
}

// withSubPath mounts subPath of the pod's volume vol into its container
// too, at /etc/{subPath}, and returns the pod.
func withSubPath(p *v1.Pod, vol, subPath string) *v1.Pod {
	c := &p.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: vol, MountPath: "/etc/" + subPath, SubPath: subPath})
	return p
}

// crashNodeObject is the node's Node: its hostname label, which a local
// PV's node affinity names, and the allocatable memory that bounds a
// Memory emptyDir.
func crashNodeObject() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{v1.LabelHostname: node}},
		Status:     v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("4Gi")}},
	}
}

// localClaim is claim "local" bound to a local PV on directory
// {host}/local, with node affinity to this node.
func localClaim(driver, host string) []runtime.Object {
	pvc, pv := csitest.BoundClaim("ns", "local", csitest.PVSpec{Driver: driver, Handle: "unused"})
	pv.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: filepath.Join(host, "local")}}
	pv.Spec.StorageClassName = "local-storage"
	pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	return []runtime.Object{pvc, pv}
}

// runContainers does what the runtime and the pod's containers do once
// its volumes are mounted: a container writes data/log into each emptyDir,
// and the runtime prepares each volumeMount with a subPath
// (SubPaths().Prepare, with the file it names written first, as the pod
// would have); its containers read the files of its configMap, secret
// and downwardAPI volumes first (readObjectFiles). What is written on a file system that a reboot takes away
// (a Memory emptyDir's tmpfs, a CSI volume, both only directories on the
// fake mounter) is volatile. Idempotent, as a container's restart is.
func (n *crashNode) runContainers(ctx context.Context, vm *VolumeManager, p *v1.Pod) error {
	if err := n.readObjectFiles(ctx, vm, p); err != nil {
		return err
	}
	for _, mv := range vm.GetMountedVolumesForPod(p.UID) {
		if mv.Plugin != emptydir.PluginName {
			continue
		}
		data := filepath.Join(mv.Path, "data")
		if err := writeFile(filepath.Join(data, "log")); err != nil {
			return err
		}
		if specVolume(p, mv.SpecName).EmptyDir.Medium == v1.StorageMediumMemory {
			n.setVolatile(data)
		}
	}
	c := p.Spec.Containers[0]
	for i, m := range c.VolumeMounts {
		if m.SubPath == "" {
			continue
		}
		mv, ok := mountedVolume(vm, p, m.Name)
		if !ok {
			return fmt.Errorf("pod %s: volume %q of subPath %q is not mounted", p.Name, m.Name, m.SubPath)
		}
		file := filepath.Join(mv.Path, m.SubPath)
		if err := writeFile(file); err != nil {
			return err
		}
		n.setVolatile(file)
		if _, err := vm.SubPaths().Prepare(ctx, subpath.Mount{Pod: p.UID, Volume: mv.DirName, VolumePath: mv.Path,
			Container: c.Name, Index: i, SubPath: m.SubPath}); err != nil {
			return err
		}
	}
	return nil
}

func (n *crashNode) setVolatile(path string) {
	n.mu.Lock()
	n.volatile[path] = true
	n.mu.Unlock()
}

// writeFile writes a line to path unless it exists, making its directory.
func writeFile(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte("written by the pod\n"), 0o644)
}

func specVolume(p *v1.Pod, name string) v1.Volume {
	for _, v := range p.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	return v1.Volume{}
}

func mountedVolume(vm *VolumeManager, p *v1.Pod, specName string) (podvol.MountedVolume, bool) {
	for _, mv := range vm.GetMountedVolumesForPod(p.UID) {
		if mv.SpecName == specName {
			return mv, true
		}
	}
	return podvol.MountedVolume{}, false
}

// fdBinder is the crash node's fake mounter, but for a bind mount of a
// file opened by descriptor (/proc/{pid}/fd/{n}, what a subPath mount
// binds): the fake mounts nothing, and subpath.Manager checks that the
// mount shows the opened file, so the target is made a hard link to the
// file, and taken back to the empty file it was at the unmount
// (fdBinds.unbind, the fake's UnmountFunc), or at a reboot. The fake
// cannot show a directory there: the scenarios bind files only.
type fdBinder struct {
	*mount.FakeMounter
	binds *fdBinds
}

func (f *fdBinder) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, sensitive, flags []string) error {
	if strings.HasPrefix(source, "/proc/") && strings.Contains(source, "/fd/") {
		if err := f.binds.bind(source, target); err != nil {
			return err
		}
	}
	return f.FakeMounter.MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype, options, sensitive, flags)
}

// fdBinds are the targets fdBinder made hard links.
type fdBinds struct {
	mu    sync.Mutex
	files map[string]bool
}

func (b *fdBinds) bind(source, target string) error {
	file, err := os.Readlink(source)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(file)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("the fake mounter binds a regular file only, not %s (%v)", file, fi.Mode().Type())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.files[target] {
		return fmt.Errorf("the fake mounter does not stack binds of a file at %s", target)
	}
	if err := os.Remove(target); err != nil {
		return err
	}
	if err := os.Link(file, target); err != nil {
		return err
	}
	b.files[target] = true
	return nil
}

// unbind puts back the empty file (subpath's mode 0640) a bind of a file
// covered at target.
func (b *fdBinds) unbind(target string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.files[target] {
		return nil
	}
	delete(b.files, target)
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.WriteFile(target, nil, 0o640)
}

// resize plays the external-resizer: the claim's PV grown to size, the
// claim marked for the node's part.
func resize(claim, size string, resizeStatus bool) func(*VolumeManager, *crashNode) {
	return func(_ *VolumeManager, n *crashNode) {
		ctx := context.Background()
		pvc, err := n.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			n.t.Error(err)
			return
		}
		pv, err := n.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			n.t.Error(err)
			return
		}
		pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse(size)
		if _, err := n.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			n.t.Error(err)
		}
		if resizeStatus {
			// The resizer of RecoverVolumeExpansionFailure (GA in 1.34).
			pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
		} else {
			pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
		}
		if _, err := n.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			n.t.Error(err)
		}
	}
}

// resized tells whether the node has done its part of a resize: the
// claim's status says size, with no condition left.
func resized(claim, size string) func(*crashNode) bool {
	return func(n *crashNode) bool {
		c, err := n.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), claim, metav1.GetOptions{})
		if err != nil {
			return false
		}
		got := c.Status.Capacity[v1.ResourceStorage]
		_, resizing := c.Status.AllocatedResourceStatuses[v1.ResourceStorage]
		return got.Cmp(resource.MustParse(size)) == 0 && len(c.Status.Conditions) == 0 && !resizing
	}
}
