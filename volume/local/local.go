package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/local-volume"

// The kubelet's names on disk.
const (
	// escapedName is the plugin's name as a path element (the kubelet's
	// EscapeQualifiedName): the pod directories and the block map files.
	escapedName = "kubernetes.io~local-volume"
	// defaultFSType is the filesystem a block device gets when the PV
	// names none.
	defaultFSType = "ext4"
)

// Config configures the plugin. Every field has the default its comment
// gives.
type Config struct {
	// RootDir holds pods/ and plugins/, as the kubelet's root directory
	// does. It is made absolute. Default "/var/lib/kubelet". Below it no
	// symlink is followed (internal/rootfs).
	RootDir string
	// Mounter makes and removes the mounts. Default mount.New("").
	Mounter mount.Interface
	// BlockMapper maps the devices of Block PVs into pods. Default
	// blockdev.NewMapper(Mounter) with losetup; the plugin checks the
	// paths under RootDir it hands to any BlockMapper for symlinks first.
	BlockMapper volume.BlockMapper
	// Exec runs blkid, fsck and mkfs when a block device is staged as a
	// filesystem (mount.SafeFormatAndMount). Default exec.New().
	Exec exec.Interface
	// EventRecorder, if set, records on a pod the kubelet's warning that
	// the volume is mounted by another pod with another fsGroup, and a
	// VolumePermissionChangeInProgress event when an ownership change runs
	// long. Default: none (logged only).
	EventRecorder record.EventRecorder
	// Steps, if set, sees every change the plugin makes to the node before
	// it is made (package step): each directory, file and symlink under
	// RootDir, each mount and unmount, each loop device of the default
	// BlockMapper. Default: none.
	Steps step.Hook
}

// plugin is the local volume plugin. The caller must not run two
// operations on the same volume of the same pod at once.
type plugin struct {
	root        string
	rfs         *rootfs.Root
	mounter     mount.Interface
	formatter   *mount.SafeFormatAndMount
	blockMapper volume.BlockMapper
	events      record.EventRecorder
	ownership   fsgroup.Reporter
	// fileType tells what the PV's path is; tests replace it.
	fileType func(path string) (fileKind, error)
}

var (
	_ volume.Plugin        = (*plugin)(nil)
	_ volume.PVPlugin      = (*plugin)(nil)
	_ volume.DeviceMounter = (*plugin)(nil)
	_ volume.Reconstructor = (*plugin)(nil)
	_ volume.StatsProvider = (*plugin)(nil)
)

// New fills in cfg's defaults and returns the local volume plugin. It also
// implements volume.PVPlugin, volume.DeviceMounter, volume.Reconstructor
// and volume.StatsProvider, found by type assertion.
func New(cfg Config) (volume.Plugin, error) {
	p, err := newPlugin(cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func newPlugin(cfg Config) (*plugin, error) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	rfs, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("local volume plugin: Config.RootDir: %w", err)
	}
	rfs = rfs.WithSteps(cfg.Steps)
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	mounter := step.Mounter(cfg.Mounter, cfg.Steps)
	if cfg.Exec == nil {
		cfg.Exec = exec.New()
	}
	if cfg.BlockMapper == nil {
		// Confined to the root, as the CSI plugin's: every directory, map
		// file and symlink it makes or removes is reached without
		// following a symlink and announced to the step hook; the device
		// it maps lies outside the root and is only read.
		m := blockdev.NewMapper(mounter)
		m.Root, m.Steps = rfs, cfg.Steps
		cfg.BlockMapper = m
	}
	return &plugin{
		root:        rfs.Path(),
		rfs:         rfs,
		mounter:     mounter,
		formatter:   mount.NewSafeFormatAndMount(mounter, cfg.Exec),
		blockMapper: cfg.BlockMapper,
		events:      cfg.EventRecorder,
		ownership:   fsgroup.Reporter{Events: cfg.EventRecorder},
		fileType:    statFileType,
	}, nil
}

// Name implements volume.Plugin.
func (p *plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: local volumes exist only as PVs,
// never inline in a pod.
func (p *plugin) CanSupport(*v1.Volume) bool { return false }

// CanSupportPV implements volume.PVPlugin: PVs with a local source.
func (p *plugin) CanSupportPV(pv *v1.PersistentVolume) bool {
	return pv != nil && pv.Spec.Local != nil
}

// Capabilities implements volume.Plugin. A local volume is not attached;
// it is staged (a block device used as a filesystem is mounted once per
// node; for a directory or a Block PV the stage does nothing but makes the
// volume's name node-scoped, as the kubelet's is); it can be a raw block
// device; and the pod's fsGroup gets ownership of a filesystem's files.
func (p *plugin) Capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{
		Stages:          true,
		Block:           true,
		OwnershipChange: spec == nil || spec.Mode != podvol.Block,
	}, nil
}

// fileKind is what a local PV's path is.
type fileKind int

const (
	kindOther fileKind = iota
	kindDirectory
	kindBlockDevice
)

// statFileType tells what path is, following symlinks, as the kubelet's
// GetFileType does.
func statFileType(path string) (fileKind, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return kindOther, err
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		return kindDirectory, nil
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice == 0:
		return kindBlockDevice, nil
	}
	return kindOther, nil
}

// source returns the PV's local path and what it is. The path must be
// absolute and without "..", as the kubelet checks; it must exist.
func (p *plugin) source(spec *podvol.VolumeSpec) (string, fileKind, error) {
	if spec.PVSource == nil || spec.PVSource.Local == nil || spec.PVSource.Local.Path == "" {
		return "", kindOther, errors.New("the PV has no local path")
	}
	path := spec.PVSource.Local.Path
	if !filepath.IsAbs(path) {
		return "", kindOther, fmt.Errorf("local path %q is not absolute", path)
	}
	for _, c := range strings.Split(path, "/") {
		if c == ".." {
			return "", kindOther, fmt.Errorf("local path %q must not contain '..'", path)
		}
	}
	kind, err := p.fileType(path)
	if err != nil {
		return "", kindOther, fmt.Errorf("local path %s: %w", path, err)
	}
	if kind == kindOther {
		return "", kindOther, fmt.Errorf("local path %s: only a directory or a block device is supported", path)
	}
	return path, kind, nil
}

// fsType is the filesystem of a block device: the PV's, or ext4.
func fsType(spec *podvol.VolumeSpec) string {
	if spec.PVSource != nil && spec.PVSource.Local != nil && spec.PVSource.Local.FSType != nil && *spec.PVSource.Local.FSType != "" {
		return *spec.PVSource.Local.FSType
	}
	return defaultFSType
}

// volumeName is the unique name of the volume of PV pvName, the
// kubelet's for a volume it stages: node-scoped.
func volumeName(pvName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(PluginName + "/" + pvName)
}

// pvName returns the volume's PV name, checked as a path element.
func pvName(spec *podvol.VolumeSpec) (string, error) {
	if err := fsutil.ValidateName("PV name", spec.PVName); err != nil {
		return "", err
	}
	return spec.PVName, nil
}

// Paths, the kubelet's.

// podVolumePath is the pod's mount of the volume:
// {root}/pods/{uid}/volumes/kubernetes.io~local-volume/{pv}.
func (p *plugin) podVolumePath(uid types.UID, pv string) (string, error) {
	if err := fsutil.ValidateName("pod UID", string(uid)); err != nil {
		return "", err
	}
	return filepath.Join(p.root, "pods", string(uid), "volumes", escapedName, pv), nil
}

// deviceMountBase holds the device mounts of block-device-backed
// filesystems: {root}/plugins/kubernetes.io/local-volume/mounts.
func (p *plugin) deviceMountBase() string {
	return filepath.Join(p.root, "plugins", PluginName, "mounts")
}

// deviceMountPath is where PV pv's block device is mounted.
func (p *plugin) deviceMountPath(pv string) string {
	return filepath.Join(p.deviceMountBase(), pv)
}

// globalMapBase holds the block volumes' directories of map files:
// {root}/plugins/kubernetes.io~local-volume/volumeDevices.
func (p *plugin) globalMapBase() string {
	return filepath.Join(p.root, "plugins", escapedName, "volumeDevices")
}

// podDeviceDir is the pod's directory of the plugin's block symlinks:
// {root}/pods/{uid}/volumeDevices/kubernetes.io~local-volume.
func (p *plugin) podDeviceDir(uid types.UID) (string, error) {
	if err := fsutil.ValidateName("pod UID", string(uid)); err != nil {
		return "", err
	}
	return filepath.Join(p.root, "pods", string(uid), "volumeDevices", escapedName), nil
}

// podsPrefix is the prefix of every path under {root}/pods.
func (p *plugin) podsPrefix() string {
	return filepath.Join(p.root, "pods") + string(filepath.Separator)
}

// podRefs returns the mount points under {root}/pods that reference what
// is mounted at (or is) path, but for except.
func (p *plugin) podRefs(path, except string) ([]string, error) {
	refs, err := p.mounter.GetMountRefs(path)
	if err != nil {
		return nil, fmt.Errorf("finding the mounts that reference %s: %w", path, err)
	}
	var out []string
	for _, r := range refs {
		if r != except && strings.HasPrefix(r, p.podsPrefix()) {
			out = append(out, r)
		}
	}
	return out, nil
}

// desc names a volume in errors.
func desc(spec *podvol.VolumeSpec) string {
	return fmt.Sprintf("%q (local PV %s)", spec.Name, spec.PVName)
}
