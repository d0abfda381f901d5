package csiplugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// Config configures a plugin. NodeName, CSIDriverLister and
// VolumeAttachmentLister are required; every other field has the default
// its comment gives.
type Config struct {
	// RootDir holds pods/ and plugins/, as the kubelet's root directory
	// does. It is made absolute. Default "/var/lib/kubelet". Below it no
	// symlink is followed: every directory and file the plugin creates,
	// mounts on, reads or removes is reached through internal/rootfs, and a
	// symlink in the way fails the operation (see docs/ARCHITECTURE.md,
	// "Paths"). Symlinks in RootDir's own path are followed.
	RootDir string
	// NodeName is this node's name; it is part of VolumeAttachment names. Required.
	NodeName string
	// Registry holds the registered CSI drivers. Default: a new, empty
	// registry.
	Registry *csi.Registry
	// CSIDriverLister reads CSIDriver objects (attachRequired,
	// podInfoOnMount, volumeLifecycleModes, fsGroupPolicy). Required.
	CSIDriverLister storagelisters.CSIDriverLister
	// VolumeAttachmentLister reads VolumeAttachments. Required.
	VolumeAttachmentLister storagelisters.VolumeAttachmentLister
	// KubeClient creates and deletes VolumeAttachments in self-attach mode
	// (Attach, Detach), reads the Secrets that PVs reference for NodeStage
	// and NodePublish, and issues the service account tokens that drivers
	// whose CSIDriver lists tokenRequests get on NodePublishVolume. Default
	// nil: those operations fail saying so.
	KubeClient kubernetes.Interface
	// Tokens issues the service account tokens of drivers whose
	// CSIDriver lists tokenRequests, and hands each out again until it
	// is due for a refresh (the volume manager shares one with the
	// projected volume plugin). Default: a cache of its own over
	// KubeClient.
	Tokens TokenSource
	// BlockMapper maps published raw block devices into pods. Default
	// blockdev.NewMapper(Mounter) confined to RootDir (Mapper.Root): bind
	// mounts through Mounter, loop devices through losetup. The plugin
	// checks the paths it hands to any BlockMapper for symlinks first.
	BlockMapper volume.BlockMapper
	// Mounter tells mount points from plain directories before they are
	// removed. Default mount.New("").
	Mounter mount.Interface
	// CallTimeout bounds each NodeStage, NodeUnstage, NodePublish and
	// NodeUnpublish call (the caller's context and the registry's own
	// timeout may end it sooner). Default DefaultCallTimeout (2 minutes,
	// the kubelet's).
	CallTimeout time.Duration
	// BootIDPath is the file that tells the node's boot ID, which the
	// plugin writes into its records of work in flight (internal/ondisk) so
	// that a restart can tell a crash from a reboot. Default
	// ondisk.DefaultBootIDPath; tests replace it to simulate a reboot. When it
	// cannot be read the records carry no boot ID and a restart never
	// concludes that the node rebooted.
	BootIDPath string
	// EventRecorder, if set, records a VolumePermissionChangeInProgress
	// event on a pod whose volume's fsGroup ownership change (nodevol's
	// own, for drivers without VOLUME_MOUNT_GROUP) runs longer than
	// PermissionChangeWarnAfter. Default: none (the warning is only logged).
	EventRecorder record.EventRecorder
	// Clock times the ownership change. Default the real clock.
	Clock clock.Clock
	// PermissionChangeWarnAfter is how long an ownership change runs
	// before it is reported, once. Default 30 seconds, the kubelet's.
	PermissionChangeWarnAfter time.Duration
	// Steps, if set, sees every change the plugin makes to the node
	// before it is made (package step): each directory, file, record and
	// symlink under RootDir, each mount and unmount through Mounter and the
	// default BlockMapper, each loop device, each CSI call that changes a
	// driver's state and each VolumeAttachment it creates or deletes. An
	// error from it is returned in place of the change. The crash-point
	// suite uses it to stop at every step; a BlockMapper the caller
	// supplies is the caller's to hook. Default: none.
	Steps step.Hook
}

// Plugin is the CSI volume plugin: it implements volume.Plugin
// for CSI volumes. Create it with New; it is safe for concurrent use, but
// the caller must not run two operations on the same volume (or on the
// same pod's volume) at once.
type plugin struct {
	root        string
	rfs         *rootfs.Root
	node        string
	drivers     *csi.Registry
	csiDrivers  storagelisters.CSIDriverLister
	attachments storagelisters.VolumeAttachmentLister
	client      kubernetes.Interface
	secrets     secretGetter
	tokens      tokenGetter
	blockMapper volume.BlockMapper
	mounter     mount.Interface
	timeout     time.Duration
	records     *ondisk.Records
	ownership   fsgroup.Reporter
	steps       step.Hook
	// ownMapper is blockMapper when that is the default mapper, confined to
	// the root: withRootHeld gives it the held root. A BlockMapper the caller
	// supplies is left as it is.
	ownMapper *blockdev.Mapper
}

var (
	_ volume.Plugin          = (*plugin)(nil)
	_ volume.CallNamer       = (*plugin)(nil)
	_ volume.AttachmentNamer = (*plugin)(nil)
	_ volume.Expander        = (*plugin)(nil)
)

// withRootHeld returns a copy of p with its root held, and the release
// that closes the hold: the copy's root (and records, and the default
// block mapper) resolve every name from one handle on the root directory,
// opened now. Each entry point (a stage, a publish, an unpublish, an
// unstage, of a file-system or a raw block volume; a reconstruction) runs
// on such a copy, and so opens the root once instead of once a call; it
// must call release when it returns. A file system mounted on the root
// later is seen by the next operation (rootfs.Root.Hold). A root that does
// not exist yet is not held: p itself is returned (with a release that
// does nothing), whose calls make the root as needed.
func (p *plugin) withRootHeld() (*plugin, func(), error) {
	h, release, err := p.rfs.HoldIfPresent()
	if err != nil {
		return nil, nil, err
	}
	q := *p
	q.rfs, q.records = h, p.records.In(h)
	if m, ok := p.blockMapper.(*blockdev.Mapper); ok && m == p.ownMapper {
		q.ownMapper = m.In(h)
		q.blockMapper = q.ownMapper
	}
	return &q, func() { q.records.Close(); release() }, nil
}

// New checks cfg, fills in defaults and returns the CSI plugin. What it
// can do beyond volume.Plugin (volume.Attacher, volume.SelfAttacher,
// volume.DeviceMounter, volume.Expander, volume.StatsProvider,
// volume.Reconstructor) is found by type assertion, as the manager does.
func New(cfg Config) (volume.Plugin, error) {
	p, err := newPlugin(cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// newPlugin is New with the concrete type, for the package's tests.
func newPlugin(cfg Config) (*plugin, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("csiplugin: Config.NodeName is required")
	}
	if cfg.CSIDriverLister == nil || cfg.VolumeAttachmentLister == nil {
		return nil, errors.New("csiplugin: Config.CSIDriverLister and Config.VolumeAttachmentLister are required")
	}
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	root, err := filepath.Abs(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("csiplugin: Config.RootDir: %w", err)
	}
	rfs, err := rootfs.New(root)
	if err != nil {
		return nil, fmt.Errorf("csiplugin: Config.RootDir: %w", err)
	}
	rfs = rfs.WithSteps(cfg.Steps)
	if cfg.Registry == nil {
		cfg.Registry = csi.NewRegistry(csi.RegistryOptions{})
	}
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	cfg.Mounter = step.Mounter(cfg.Mounter, cfg.Steps)
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = csi.DefaultCallTimeout
	}
	var ownMapper *blockdev.Mapper
	if cfg.BlockMapper == nil {
		ownMapper = blockdev.NewMapper(cfg.Mounter)
		ownMapper.Root, ownMapper.Steps = rfs, cfg.Steps
		cfg.BlockMapper = ownMapper
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.PermissionChangeWarnAfter <= 0 {
		cfg.PermissionChangeWarnAfter = fsgroup.DefaultWarnAfter
	}
	bootID, err := ondisk.ReadBootID(cfg.BootIDPath)
	if err != nil {
		klog.Background().Error(err, "Records of work in flight carry no boot ID: a restart will not tell a reboot from a crash")
	}
	return &plugin{
		records:     ondisk.NewRecords(rfs, bootID),
		root:        root,
		rfs:         rfs,
		node:        cfg.NodeName,
		drivers:     cfg.Registry,
		csiDrivers:  cfg.CSIDriverLister,
		attachments: cfg.VolumeAttachmentLister,
		client:      cfg.KubeClient,
		secrets:     newSecretGetter(cfg.KubeClient),
		tokens:      newTokenGetter(cfg.KubeClient, cfg.Tokens, cfg.Clock),
		blockMapper: cfg.BlockMapper,
		ownMapper:   ownMapper,
		mounter:     cfg.Mounter,
		timeout:     cfg.CallTimeout,
		ownership:   fsgroup.Reporter{Clock: cfg.Clock, WarnAfter: cfg.PermissionChangeWarnAfter, Events: cfg.EventRecorder},
		steps:       cfg.Steps,
	}, nil
}

// BootID is the node's boot ID as read at New ("" if it could not be read).
func (p *plugin) BootID() string { return p.records.BootID() }

// volumeDesc names a volume in errors and logs.
func volumeDesc(spec *podvol.VolumeSpec) string {
	if spec.MigratedFrom != "" {
		return fmt.Sprintf("%q (PV %s, driver %s, migrated from in-tree %s)", spec.Name, spec.PVName, spec.Driver, spec.MigratedFrom)
	}
	if spec.PVName != "" {
		return fmt.Sprintf("%q (PV %s, driver %s)", spec.Name, spec.PVName, spec.Driver)
	}
	return fmt.Sprintf("%q (driver %s)", spec.Name, spec.Driver)
}

// csiDriver returns the driver's CSIDriver object, or nil when there is none.
func (p *plugin) csiDriver(name string) (*storagev1.CSIDriver, error) {
	d, err := p.csiDrivers.Get(name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading CSIDriver %s: %w (%w)", name, err, volume.ErrNotReady)
	}
	return d, nil
}

// driverAndClient returns the driver's CSIDriver (nil when it has none)
// and its client: what a publish needs of both.
func (p *plugin) driverAndClient(name string) (*storagev1.CSIDriver, *csi.Client, error) {
	driver, err := p.csiDriver(name)
	if err != nil {
		return nil, nil, err
	}
	client, err := p.drivers.Client(name)
	if err != nil {
		return nil, nil, err
	}
	return driver, client, nil
}
