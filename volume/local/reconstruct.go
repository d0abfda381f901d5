package local

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/podscan"
)

// Reconstruct implements volume.Reconstructor: it returns the local
// volumes the kubelet or an earlier run left, in the kubelet's layout:
//
//   - each pods/{uid}/volumes/kubernetes.io~local-volume/{pv} directory, a
//     pod mount: Mounted when rc.MountPoints shows it mounted, else
//     Uncertain (a directory left empty by a cut-short SetUp or TearDown,
//     or after a reboot), so that it is set up again or torn down; its
//     contents are never touched here;
//   - each plugins/kubernetes.io/local-volume/mounts/{pv} directory, a
//     device mount, in the same way;
//   - each pods/{uid}/volumeDevices/kubernetes.io~local-volume/{pv}
//     symlink, and each map file
//     plugins/kubernetes.io~local-volume/volumeDevices/{pv}/{uid} left
//     without one (an unmap cut short), a Block pod mapping, and each
//     directory of map files a Block device: all Uncertain, as the kubelet
//     reconstructs block volumes.
//
// The volumes are named as the volume manager names a local PV's
// (kubernetes.io/local-volume/{pv}); the pod's volume is named after the
// PV, as its directory is. Nothing is removed, and no symlink below the
// root is followed: one where a directory is expected is logged and
// skipped.
func (p *plugin) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	s := &scan{p: p, logger: klog.FromContext(ctx), rc: rc, linked: map[[2]string]bool{}}
	for _, uid := range s.dirs(filepath.Join(p.root, "pods"), "pod UID") {
		s.podVolumes(types.UID(uid))
		s.podLinks(types.UID(uid))
	}
	for _, pv := range s.dirs(p.deviceMountBase(), "PV name") {
		path := p.deviceMountPath(pv)
		s.out.Devices = append(s.out.Devices, volume.FoundDevice{Spec: foundSpec(pv, podvol.Filesystem), Path: path, State: s.state(path)})
	}
	for _, pv := range s.dirs(p.globalMapBase(), "PV name") {
		s.globalMapDir(pv)
	}
	return s.out
}

// scan is one reconstruction.
type scan struct {
	p      *plugin
	logger klog.Logger
	rc     volume.Recovery
	out    volume.Found
	// linked are the (pv, pod UID) of the block symlinks found.
	linked map[[2]string]bool
}

// foundSpec is the spec of PV pv's volume found on disk: what TearDown and
// UnmountDevice need, and the name the volume manager gives it.
func foundSpec(pv string, mode podvol.VolumeMode) podvol.VolumeSpec {
	return podvol.VolumeSpec{Name: volumeName(pv), Plugin: PluginName, PVName: pv, Mode: mode}
}

// state is Mounted when the mount table shows path mounted, else
// Uncertain.
func (s *scan) state(path string) podvol.MountState {
	if s.rc.MountPoints[path] {
		return podvol.Mounted
	}
	return podvol.Uncertain
}

// entries lists dir; a missing dir has none, and one that cannot be read
// is logged.
func (s *scan) entries(dir string) []fs.DirEntry {
	entries, err := s.p.rfs.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Error(err, "Cannot list a directory of local volumes, leaving it alone", "path", dir)
	}
	return entries
}

// dirs returns the names of the directories in dir that are valid names
// of kind; anything else is logged and skipped.
func (s *scan) dirs(dir, kind string) []string {
	var names []string
	for _, e := range s.entries(dir) {
		if !e.IsDir() {
			s.logger.Info("Not a directory where the local volume plugin keeps directories, leaving it alone", "path", filepath.Join(dir, e.Name()), "type", e.Type().String())
			continue
		}
		if err := fsutil.ValidateName(kind, e.Name()); err != nil {
			s.logger.Error(err, "Leaving a directory alone", "path", filepath.Join(dir, e.Name()))
			continue
		}
		names = append(names, e.Name())
	}
	return names
}

// podVolumes reconstructs the pod's local volume mounts.
func (s *scan) podVolumes(uid types.UID) {
	base := filepath.Join(s.p.root, "pods", string(uid), "volumes", escapedName)
	for _, pv := range s.dirs(base, "PV name") {
		path := filepath.Join(base, pv)
		s.out.Attempted++
		s.out.Mounts = append(s.out.Mounts, volume.FoundMount{
			Spec: foundSpec(pv, podvol.Filesystem), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: pv},
			Path: path, State: s.state(path),
		})
		s.logger.V(2).Info("Reconstructed local volume", "podUID", uid, "pv", pv, "path", path)
	}
}

// podLinks reconstructs the pod's Block volume symlinks.
func (s *scan) podLinks(uid types.UID) {
	base, err := s.p.podDeviceDir(uid)
	if err != nil {
		return
	}
	for _, e := range s.entries(base) {
		path := filepath.Join(base, e.Name())
		if e.Type()&fs.ModeSymlink == 0 || fsutil.ValidateName("PV name", e.Name()) != nil {
			s.logger.Info("Not a block volume symlink, leaving it alone", "path", path, "type", e.Type().String())
			continue
		}
		s.out.Attempted++
		s.linked[[2]string{e.Name(), string(uid)}] = true
		s.out.Mounts = append(s.out.Mounts, s.blockMount(e.Name(), uid, path))
		s.logger.V(2).Info("Reconstructed local block volume", "podUID", uid, "pv", e.Name(), "path", path)
	}
}

// blockMount is a Block pod mapping found on disk: Uncertain.
func (s *scan) blockMount(pv string, uid types.UID, link string) volume.FoundMount {
	return volume.FoundMount{
		Spec: foundSpec(pv, podvol.Block), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: pv},
		Path: link, State: podvol.Uncertain,
	}
}

// globalMapDir reconstructs a Block volume's directory of map files: the
// device, and the pod mappings whose symlink is gone.
func (s *scan) globalMapDir(pv string) {
	dir := filepath.Join(s.p.globalMapBase(), pv)
	s.out.Devices = append(s.out.Devices, volume.FoundDevice{Spec: foundSpec(pv, podvol.Block), Path: dir, State: podvol.Uncertain})
	for _, e := range s.entries(dir) {
		uid := types.UID(e.Name())
		if s.linked[[2]string{pv, string(uid)}] {
			continue
		}
		podDir, err := s.p.podDeviceDir(uid)
		if err != nil {
			s.logger.Error(err, "Leaving a map file alone", "path", filepath.Join(dir, e.Name()))
			continue
		}
		s.out.Attempted++
		s.out.Mounts = append(s.out.Mounts, s.blockMount(pv, uid, filepath.Join(podDir, pv)))
		s.logger.Info("Found a block volume's map file without its pod's symlink (an unmap cut short); it is unmapped unless the pod still wants it",
			"podUID", uid, "pv", pv, "path", filepath.Join(dir, e.Name()))
	}
}

// Retake implements volume.Reconstructor. Reconstruct lists nothing as
// unreadable (a local volume directory holds no metadata to read); dir, a
// pod volume directory, is removed if it is an empty directory and not a
// mount point.
func (p *plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	return podscan.RemoveEmptyDir(ctx, p.rfs, dir, mounted, "local")
}
