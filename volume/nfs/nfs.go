// Package nfs is the volume plugin of NFS volumes: pod volumes with an nfs
// source and PersistentVolumes with spec.nfs, the kubelet's
// kubernetes.io/nfs, with its layout on disk so that a node can move
// between the kubelet and nodevol.
//
// As the kubelet v1.37 does, the plugin mounts the export once per pod,
// with file system type "nfs", through the mounter (mount.Interface,
// which runs the host's mount command and with it the mount.nfs helper),
// at {root}/pods/{uid}/volumes/kubernetes.io~nfs/{name}, the name being
// the pod's volume name, or the PV's for a claim:
//
//   - the volume's unique name is pod-scoped, {plugin}/{podUID}-{name}:
//     it is neither attached nor staged;
//   - the source is "server:path", an IPv6 server in brackets
//     ("[fd00::1]:/export");
//   - the options are the PV's mount options (its
//     volume.beta.kubernetes.io/mount-options annotation when it has one,
//     else spec.mountOptions; the volume manager resolves which) and "ro"
//     when the volume is read-only, without duplicates and sorted, as the
//     kubelet joins them; a pod volume's read-only flag is its nfs
//     source's readOnly, a claim's the pod's persistentVolumeClaim
//     readOnly (as the kubelet, the PV's own spec.nfs.readOnly is not
//     read), and containers then mount the volume read-only;
//   - SetUp does nothing when the directory is a mount point already; a
//     mount that fails is unmounted if it left a mount, and its directory
//     removed, and the error carries the mounter's text (mount's exit
//     status, its arguments and mount.nfs's output), the kubelet's words;
//   - TearDown is the kubelet's clean-up with its extensive check: a
//     directory that is a mount point (the mount table says so, not only
//     a change of device) is unmounted, with the mounter's forced unmount
//     after a minute when it has one, and the directory removed once it is
//     no mount point; a mount whose server is gone (stat fails with ESTALE,
//     ENOTCONN, EIO, ...) is unmounted without the check, as the kubelet's
//     corrupted mount;
//   - no fsGroup ownership change (the kubelet's nfs SetUp applies none:
//     the export's owners are the server's), no SELinux context mount, no
//     raw block device, no expansion;
//   - usage is statfs of the pod's mount (the kubelet's MetricsStatFS):
//     the export's file system as the server reports it.
//
// Reconstruct finds the pod directories the kubelet or an earlier run left,
// Mounted when the mount table shows them mounted, else Uncertain.
//
// Below the root no symlink is followed (internal/rootfs): the pod's
// directory is made, checked before the mount and the unmount, and removed
// without following one. What it does not do of the kubelet's: the
// recycler (a controller's work). The host must have the NFS client: the
// kernel's nfs module and mount.nfs (nfs-common, nfs-utils), as for the
// kubelet.
package nfs

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
	netutil "k8s.io/utils/net"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/nfs"

const (
	// escapedName is the plugin's name as a path element (the kubelet's
	// EscapeQualifiedName).
	escapedName = "kubernetes.io~nfs"
	// fsType is the file system type the export is mounted with.
	fsType = "nfs"
	// unmountTimeout is how long a forced unmounter waits for a plain
	// unmount before it forces one, the kubelet's for nfs.
	unmountTimeout = time.Minute
)

// Config configures the plugin. Every field has the default its comment
// gives.
type Config struct {
	// RootDir holds pods/, as the kubelet's root directory does. It is
	// made absolute. Default "/var/lib/kubelet". Below it no symlink is
	// followed (internal/rootfs).
	RootDir string
	// Mounter makes and removes the mounts. Default mount.New(""). When
	// it is a mount.MounterForceUnmounter (mount.New's is), TearDown
	// forces an unmount that has not finished in a minute, as the kubelet
	// does for an export whose server is gone.
	Mounter mount.Interface
	// Steps, if set, sees every change the plugin makes to the node
	// before it is made (package step): each directory under RootDir,
	// each mount and unmount. Default: none.
	Steps step.Hook
}

// plugin is the nfs volume plugin. The caller must not run two
// operations on the same volume of the same pod at once.
type plugin struct {
	root    string
	rfs     *rootfs.Root
	mounter mount.Interface
	// force is the configured mounter when it can force an unmount.
	force mount.MounterForceUnmounter
	steps step.Hook
	// lstat describes a path below the root without following symlinks
	// (rfs.Lstat); tests replace it to show a mount whose server is gone.
	lstat func(name string) (fs.FileInfo, error)
}

var (
	_ volume.Plugin        = (*plugin)(nil)
	_ volume.PVPlugin      = (*plugin)(nil)
	_ volume.Reconstructor = (*plugin)(nil)
	_ volume.StatsProvider = (*plugin)(nil)
)

// New fills in cfg's defaults and returns the nfs volume plugin. It also
// implements volume.PVPlugin, volume.Reconstructor and
// volume.StatsProvider, found by type assertion.
func New(cfg Config) (volume.Plugin, error) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	rfs, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("nfs volume plugin: Config.RootDir: %w", err)
	}
	rfs = rfs.WithSteps(cfg.Steps)
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	p := &plugin{root: rfs.Path(), rfs: rfs, mounter: step.Mounter(cfg.Mounter, cfg.Steps), steps: cfg.Steps}
	p.force, _ = cfg.Mounter.(mount.MounterForceUnmounter)
	p.lstat = rfs.Lstat
	return p, nil
}

// Name implements volume.Plugin.
func (*plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with an nfs source.
func (*plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.NFS != nil }

// CanSupportPV implements volume.PVPlugin: PVs with spec.nfs.
func (*plugin) CanSupportPV(pv *v1.PersistentVolume) bool {
	return pv != nil && pv.Spec.NFS != nil
}

// Capabilities implements volume.Plugin: an NFS volume is neither attached
// nor staged, never a raw block device, never published again, and gets
// no ownership change. A pod volume whose nfs source is readOnly is
// mounted read-only in every container, as the kubelet's mounter
// attributes say (a claim's read-only flag is the pod's, already).
func (*plugin) Capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	ro := spec != nil && spec.Source != nil && spec.Source.NFS != nil && spec.Source.NFS.ReadOnly
	return volume.Capabilities{ReadOnly: ro}, nil
}

// source is what is mounted for a pod: the export and the options.
type source struct {
	server, path string
	readOnly     bool
	options      []string
}

// device is the mount's source, "server:path", an IPv6 server bracketed.
func (s source) device() string {
	server := s.server
	if netutil.IsIPv6String(server) {
		server = "[" + server + "]"
	}
	return server + ":" + s.path
}

// sourceOf returns what spec's volume mounts for the pod volume vol: the
// pod volume's nfs source (read-only as it says), or the PV's (read-only
// as the pod's claim says), with the PV's mount options and "ro" joined
// as the kubelet joins them.
func sourceOf(spec *podvol.VolumeSpec, vol podvol.PodVolume) (source, error) {
	var s source
	switch {
	case spec.Source != nil && spec.Source.NFS != nil:
		n := spec.Source.NFS
		s = source{server: n.Server, path: n.Path, readOnly: n.ReadOnly}
	case spec.PVSource != nil && spec.PVSource.NFS != nil:
		n := spec.PVSource.NFS
		s = source{server: n.Server, path: n.Path, readOnly: vol.ReadOnly}
	default:
		return source{}, fmt.Errorf("the volume has no nfs source")
	}
	if s.server == "" || s.path == "" {
		return source{}, fmt.Errorf("the nfs source needs a server and a path (server %q, path %q)", s.server, s.path)
	}
	var system []string
	if s.readOnly {
		system = []string{"ro"}
	}
	s.options = joinOptions(spec.MountOptions, system)
	return s, nil
}

// joinOptions is the kubelet's JoinMountOptions: the user's options but
// the empty ones, and the system's, each once, sorted.
func joinOptions(user, system []string) []string {
	var out []string
	for _, o := range user {
		if o != "" {
			out = append(out, o)
		}
	}
	out = append(out, system...)
	slices.Sort(out)
	return slices.Compact(out)
}

// podDir is the pod's mount of the volume,
// {root}/pods/{uid}/volumes/kubernetes.io~nfs/{name}: {name} is the PV's
// name for a claim, else the pod's volume name (also that of a volume
// found on disk, named after its directory); both it and the UID are
// checked as path elements.
func (p *plugin) podDir(spec *podvol.VolumeSpec, vol podvol.PodVolume) (string, error) {
	name := vol.SpecName
	if spec.PVName != "" {
		name = spec.PVName
	}
	if err := fsutil.ValidateName("volume name", name); err != nil {
		return "", err
	}
	if err := fsutil.ValidateName("pod UID", string(vol.Pod.UID)); err != nil {
		return "", err
	}
	return filepath.Join(p.root, "pods", string(vol.Pod.UID), "volumes", escapedName, name), nil
}

// volumeName is the unique name the volume manager gives pod uid's nfs
// volume whose directory is name: pod-scoped, as the kubelet's.
func volumeName(uid types.UID, name string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", PluginName, uid, name))
}

// desc names the pod's volume in errors, with its export when known.
func desc(spec *podvol.VolumeSpec, vol podvol.PodVolume, s *source) string {
	name := fmt.Sprintf("%q", vol.SpecName)
	if spec.PVName != "" {
		name += " (PV " + spec.PVName + ")"
	}
	if s != nil {
		name += fmt.Sprintf(" (server %s, path %s)", s.server, s.path)
	}
	return "nfs volume " + name
}
