package flexvolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// Reconstruct implements volume.Reconstructor for the drivers known now
// (those Run found at start): each pods/{uid}/volumes/{vendor~driver}/{name}
// directory is a pod mount and, for a driver that attaches, each
// plugins/kubernetes.io/flexvolume/{driver}/mounts/{name} a staged device;
// Mounted when rc.MountPoints shows it mounted, else Uncertain. They are
// named as the volume manager names them (the kubelet's names). Nothing is
// removed and no symlink is followed.
func (ds *Drivers) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	logger := klog.FromContext(ctx)
	ds.mu.Lock()
	drivers := make([]*driver, 0, len(ds.known))
	for _, d := range ds.known {
		drivers = append(drivers, d)
	}
	ds.mu.Unlock()
	slices.SortFunc(drivers, func(a, b *driver) int { return strings.Compare(a.name, b.name) })
	var out volume.Found
	state := func(path string) podvol.MountState {
		if rc.MountPoints[path] {
			return podvol.Mounted
		}
		return podvol.Uncertain
	}
	pods := ds.dirs(ctx, filepath.Join(ds.host.root, "pods"), "pod UID")
	for _, d := range drivers {
		for _, uid := range pods {
			base := filepath.Join(ds.host.root, "pods", uid, "volumes", d.dirName)
			for _, name := range ds.dirs(ctx, base, "volume name") {
				path := filepath.Join(base, name)
				out.Attempted++
				out.Mounts = append(out.Mounts, volume.FoundMount{
					Spec:   d.foundSpec(types.UID(uid), name),
					Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid)}, SpecName: name},
					Path:   path, State: state(path),
				})
				logger.V(2).Info("Reconstructed flexVolume", "driver", d.name, "podUID", uid, "volume", name, "path", path)
			}
		}
		if !d.caps.Attach {
			continue
		}
		for _, name := range ds.dirs(ctx, d.mountsDir(), "volume name") {
			path := filepath.Join(d.mountsDir(), name)
			out.Devices = append(out.Devices, volume.FoundDevice{Spec: d.foundSpec("", name), Path: path, State: state(path)})
		}
	}
	return out
}

// foundSpec is the spec of a volume found on disk: what TearDown and
// UnmountDevice need, named as the volume manager names it (pod-scoped,
// {driver}/{uid}-{name}, for a driver that does not attach).
func (d *driver) foundSpec(uid types.UID, name string) podvol.VolumeSpec {
	spec := podvol.VolumeSpec{
		Name: podvol.UniqueVolumeName(d.name + "/" + name), Plugin: d.name, Mode: podvol.Filesystem,
		Source: &v1.VolumeSource{FlexVolume: &v1.FlexVolumeSource{Driver: d.name}},
	}
	if !d.caps.Attach {
		spec.Name, spec.Ephemeral = podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", d.name, uid, name)), true
	}
	return spec
}

// dirs returns the names of the directories in dir that are valid names
// of kind; anything else is logged and skipped.
func (ds *Drivers) dirs(ctx context.Context, dir, kind string) []string {
	entries, err := ds.host.rfs.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.FromContext(ctx).Error(err, "Cannot list a directory of flexVolumes, leaving it alone", "path", dir)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() || fsutil.ValidateName(kind, e.Name()) != nil {
			continue
		}
		names = append(names, e.Name())
	}
	return names
}

// Retake implements volume.Reconstructor. Reconstruct lists nothing as
// unreadable; dir is removed if it is an empty directory and no mount
// point.
func (ds *Drivers) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	if mounted == nil || mounted[dir] {
		return false
	}
	if _, err := ds.host.rfs.Rel(dir); err != nil {
		return false
	}
	if err := ds.host.rfs.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	klog.FromContext(ctx).Info("Removed a flexVolume directory found unreadable at start", "path", dir)
	return true
}
