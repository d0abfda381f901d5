package volumemanager

import (
	"path/filepath"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/flexvolume"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// Config configures a VolumeManager. NodeName and KubeClient are required;
// every other field has the default its comment gives.
type Config struct {
	// NodeName is this node's name. Required.
	NodeName string
	// KubeClient reads PVCs, PVs, CSIDrivers, VolumeAttachments and Secrets. Required.
	KubeClient kubernetes.Interface
	// RootDir holds pods/, plugins/ and plugins_registry/, as the kubelet's
	// root directory does. Default "/var/lib/kubelet".
	RootDir string
	// Mounter checks and removes mount points, and makes the mounts of
	// the plugins that mount themselves (emptyDir's tmpfs, local PVs, nfs
	// exports with type "nfs", which needs the host's mount.nfs; a
	// mount.MounterForceUnmounter, as mount.New's is, also forces the
	// unmount of an nfs export whose server is gone). Default
	// mount.New("").
	Mounter mount.Interface
	// Clock drives backoff and the resync. Default the real clock.
	Clock clock.WithTicker
	// Registerer, if set, receives the manager's Prometheus metrics.
	Registerer prometheus.Registerer
	// EventRecorder, if set, records FailedMount and FailedAttachVolume events on pods,
	// and VolumePermissionChangeInProgress when an fsGroup ownership change runs long.
	EventRecorder record.EventRecorder
	// InformerFactory, if set, is used (and started by Run) instead of a new one.
	InformerFactory informers.SharedInformerFactory
	// Drivers is the CSI driver registry. Default: a new one, reachable through Drivers().
	Drivers *csi.Registry
	// BlockMapper maps raw block devices into pods. Default: bind mounts
	// through Mounter and loop devices through losetup (internal/blockdev).
	BlockMapper volume.BlockMapper
	// Plugin replaces the CSI plugin built from the fields above (tests);
	// it must be named kubernetes.io/csi, which starts the unique name of
	// every CSI volume. Default: csiplugin.New.
	Plugin volume.Plugin
	// Plugins are the embedder's own volume plugins, registered beside
	// the CSI plugin and the image plugin (kubernetes.io/image): a pod
	// volume whose source one of them claims (CanSupport) is resolved to
	// a pod-scoped volume of that plugin (podvol.VolumeSpec.Plugin and
	// Source set, never attached or staged; node-scoped,
	// {plugin}/{volume name} as the kubelet names it, when its
	// Capabilities say Attachable or Stages) and set up and torn down
	// with its SetUp and TearDown. Each name must be unique and no
	// prefix of another, up to a slash; New refuses a kind of pod volume
	// source that two plugins claim. Default: none.
	Plugins []volume.Plugin
	// Node returns this node's Node object, whose labels are matched
	// against every PV's node affinity before the PV is mounted and whose
	// status.allocatable memory bounds an emptyDir of medium Memory, as
	// the kubelet does with its own. Pod resolution calls it, so it must
	// answer from memory (a lister); an error leaves the pod volumes that
	// need it unresolved until the next resync. Default: an informer on
	// this one Node (field selector on NodeName), started by Run; a
	// change of its labels or allocatable memory resolves the pods again
	// that could not be resolved.
	Node func() (*v1.Node, error)
	// CSICallTimeout bounds each CSI call. Default 2 minutes, the kubelet's.
	CSICallTimeout time.Duration
	// ResyncPeriod is how often every volume is planned again, to catch
	// changes made behind nodevol's back, and (unless ClusterInformers)
	// how often a held claim or attachment is read again, plus up to half
	// as long at random. Default 1 minute.
	ResyncPeriod time.Duration
	// Workers is unused: one loop plans every volume (planning is cheap;
	// operations run concurrently, bounded by MaxConcurrentOperations).
	// Kept so that existing callers compile.
	//
	// Deprecated: has no effect.
	Workers int
	// MaxConcurrentOperations bounds CSI operations in flight. Default 32
	// per CPU (runtime.GOMAXPROCS), at least 64: see
	// defaultMaxConcurrentOperations.
	MaxConcurrentOperations int
	// MountTimeout bounds WaitForAttachAndMount and WaitForUnmount when the
	// caller's context has no deadline. Default 2m3s, the kubelet's.
	MountTimeout time.Duration
	// ClaimPendingGracePeriod is how long a pod volume's claim may be
	// missing or not bound before WaitForAttachAndMount takes it as final
	// and returns (errors.Is(err, ErrFinal)), measured from when the loop
	// first saw that pod volume so. Default 5s: the scheduler places no pod
	// whose claims are unbound, so a claim still missing on the node is
	// informer lag (the pod may reach the node before its claim reaches the
	// claim informer: well under a second on a healthy cluster) or a
	// mistake that waiting out MountTimeout will not mend.
	ClaimPendingGracePeriod time.Duration
	// ShutdownGracePeriod is how long the operations in flight when Run's
	// context ends may go on before their contexts are cancelled too
	// (volumemanager/shutdown.go): Run starts nothing new once its context
	// is done and returns when every operation has. Default 0: they are
	// cancelled at once.
	ShutdownGracePeriod time.Duration
	// PluginRegistration, when true, makes Run also run a plugin manager on
	// RegistrationDir: CSI drivers announced there by their registrars
	// (node-driver-registrar) are registered in Drivers and recorded on the
	// Node and CSINode, as with the kubelet. Default false: drivers are
	// registered through Drivers().Register.
	PluginRegistration bool
	// VolumePluginDir is the directory of flexVolume drivers, the
	// kubelet's --volume-plugin-dir: each {vendor~driver}/{driver}
	// executable there is the driver "vendor/driver", initialised when Run
	// starts and again whenever its directory changes (watched with
	// fsnotify); a removed driver goes.
	// nodevol never creates the directory: while it is missing there are
	// no drivers, and it is picked up once it appears. Default
	// /usr/libexec/kubernetes/kubelet-plugins/volume/exec/, the kubelet's.
	VolumePluginDir string
	// RegistrationDir is the plugin registration directory. Default
	// {RootDir}/plugins_registry.
	RegistrationDir string
	// ReportVolumesInUse, when true, makes Run keep the Node's
	// status.volumesInUse equal to GetVolumesInUse, as the kubelet's node
	// status does, and confirm the attachment of a volume that needs one
	// only after it has been reported: the attach/detach controller then
	// never detaches a volume that may be mounted. A node agent that
	// reports volumesInUse itself leaves it false. Default false.
	ReportVolumesInUse bool
	// BootIDPath is the file that tells the node's boot ID (default
	// /proc/sys/kernel/random/boot_id). The CSI plugin writes it into its
	// records of work in flight, and Run compares them with it: a record
	// of another boot means the node rebooted and nothing is mounted any
	// more. Tests replace the file to simulate a reboot.
	BootIDPath string
	// ClusterInformers, when true, reads PersistentVolumeClaims,
	// PersistentVolumes and VolumeAttachments through informers that list
	// and watch every one in the cluster, as nodevol did by default before
	// it had the object cache. It costs no request per volume, but every
	// node then keeps a copy of every claim, volume and attachment of the
	// cluster (memory and the first list grow with the cluster, not with
	// the node's pods), and the client needs list and watch on them: a
	// node's own credentials (the Node authorizer) may not, and the wait
	// errors then say that this field is set. For small clusters and
	// tests. Default false: the node's object cache reads them one at a
	// time with GET, as the kubelet does, which a node's own credentials
	// may (get on the three is all the client needs): a pod holds its
	// claims and the volumes they are bound to, each read when first held
	// and dropped with its last pod; while held, a claim is read again
	// every ResyncPeriod to 1.5 ResyncPeriod (the kubelet reads it at each
	// pod sync, every 60-90 s), and a volume when its claim changed (the
	// resizer grows the volume, then marks the claim) or a pod newly holds
	// it a ResyncPeriod or more after its last read; a VolumeAttachment is
	// read while its volume waits for the attach, every second at first.
	// Either way CSIDrivers come through an informer.
	ClusterInformers bool
	// NodeRestricted asked for what is now the default: claims, volumes
	// and attachments read one at a time through the object cache. Kept
	// so that existing callers compile.
	//
	// Deprecated: has no effect; ClusterInformers asks for informers.
	NodeRestricted bool
	// SELinuxEnabled reports whether the host has SELinux enabled; asked
	// once, by New. Pods' volumes are mounted with an SELinux context only
	// where it does (volumemanager/internal/resolve/selinux.go). Default: selinuxfs is
	// mounted read-write at /sys/fs/selinux and this process has an SELinux
	// label, as go-selinux's GetEnabled decides.
	SELinuxEnabled func() bool
	// SelfAttach, when true, makes the node attach volumes itself, as the
	// kubelet does with --enable-controller-attach-detach=false: it
	// creates each volume's VolumeAttachment (csi-sha256(handle, driver,
	// node), spec as the attach/detach controller writes it), waits for
	// the external-attacher to attach it, and deletes it after the
	// volume's last unstage, waiting until it is gone. The client then
	// needs create, get and delete on volumeattachments, and the Node must
	// not carry the annotation volumes.kubernetes.io/controller-managed-attach-detach
	// (SetNodeAttachMode). ReportVolumesInUse does not hold the attach in
	// this mode. Default false: the attach/detach controller attaches, and
	// the node waits for it.
	SelfAttach bool
	// Steps, if set, sees every change the manager makes to the node
	// before it is made (package step): the default plugin's
	// directories, files, records, mounts, loop devices, CSI calls and
	// VolumeAttachments (csiplugin.Config.Steps), and reconstruction's
	// clean-up at Run. An error from it is returned in place of the
	// change. It is the seam of the crash-point suite, which stops at every
	// step; a Plugin or BlockMapper the caller supplies is the caller's to
	// hook. Default: none.
	Steps step.Hook
	// VolumeStatsPeriod is how long the kubelet_volume_stats_* gauges (with
	// a Registerer) reuse a volume's NodeGetVolumeStats answer. Default 1
	// minute, the kubelet's --volume-stats-agg-period.
	VolumeStatsPeriod time.Duration
	// VolumesInUseReportedByCaller, when true, says that the caller keeps
	// the Node's status.volumesInUse itself (a kubelet fork's node status
	// loop, fed by GetVolumesInUse) and calls MarkVolumesAsReportedInUse
	// with what it has reported: a volume that needs attaching is confirmed
	// attached, and staged, only once that list names it, as with
	// ReportVolumesInUse. The two are exclusive: New refuses both. Default
	// false: MarkVolumesAsReportedInUse has no effect.
	VolumesInUseReportedByCaller bool
	// EnvReadByCaller, when true, says that the caller resolves its
	// containers' env, envFrom and imagePullSecrets itself (a kubelet
	// fork's configMap and secret managers): AddPod then holds no object
	// for them, and Objects answers only what the pods' volumes read.
	// Default false: each pod added holds, in the node's object cache, the
	// configMaps and secrets its containers read, watched while it runs
	// (one watch per object, shared with the volumes that read it), and
	// Objects reads them.
	EnvReadByCaller bool
	// VolumeStatsCollectedByCaller, when true, leaves the
	// kubelet_volume_stats_* gauges out of Registerer: the caller exports
	// them itself (a kubelet fork's own collector, which reads each
	// volume's usage through GetVolumeStatsFor and registers the same
	// names; two collectors of one name make registration fail). Default
	// false: with a Registerer, the manager exports them.
	VolumeStatsCollectedByCaller bool
	// VolumeHealth, when set, makes Run probe the health of the pods' CSI
	// volumes (NodeGetVolumeHealth, given to VolumeHealth.Updater) and of
	// the drivers' storage (NodeGetStorageHealth, written into the
	// CSINode's status.storageHealth), for drivers with those node
	// capabilities (CSI 1.13): the kubelet's CSIVolumeHealth feature
	// (volumehealth.go). Default nil: off, as the feature is in the
	// kubelet 1.37.
	VolumeHealth *VolumeHealthConfig
	// SizeLimit says how a pod volume over its size limit (an emptyDir
	// over its sizeLimit) is reported: an event on the pod, a gauge and
	// a callback (SizeLimitConfig, sizelimit.go), from the measurements
	// the manager makes and, every VolumeStatsPeriod, one of each such
	// volume nothing else measured. nodevol evicts nothing. Default: on,
	// with no callback.
	SizeLimit SizeLimitConfig
}

func setDefaults(cfg *Config) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Drivers == nil {
		cfg.Drivers = csi.NewRegistry(csi.RegistryOptions{Registerer: cfg.Registerer})
	}
	if cfg.CSICallTimeout <= 0 {
		cfg.CSICallTimeout = 2 * time.Minute
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = time.Minute
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.MaxConcurrentOperations <= 0 {
		cfg.MaxConcurrentOperations = defaultMaxConcurrentOperations()
	}
	if cfg.VolumeStatsPeriod <= 0 {
		cfg.VolumeStatsPeriod = time.Minute
	}
	if cfg.RegistrationDir == "" {
		cfg.RegistrationDir = filepath.Join(cfg.RootDir, "plugins_registry")
	}
	if cfg.VolumePluginDir == "" {
		cfg.VolumePluginDir = flexvolume.DefaultPluginDir
	}
	if cfg.MountTimeout <= 0 {
		cfg.MountTimeout = 2*time.Minute + 3*time.Second
	}
	if cfg.ClaimPendingGracePeriod <= 0 {
		cfg.ClaimPendingGracePeriod = 5 * time.Second
	}
	if cfg.SELinuxEnabled == nil {
		cfg.SELinuxEnabled = resolve.HostSELinuxEnabled
	}
}

// defaultMaxConcurrentOperations is Config.MaxConcurrentOperations'
// default: 32 operations in flight per CPU, at least 64. An operation
// spends most of its time waiting (on the driver, on the file system), so
// the CPUs are kept busy only when enough operations are in flight to cover
// those waits: mounting 5,000 pods on 2 CPUs took 1.5 times as long with
// 16 in flight as with 64, and 256 gained nothing over 64
// (BenchmarkMaxConcurrentOperations; "Parallelism" in
// docs/perf/2026-11-23-issue-16-unmount-cpu-scale.md). A fixed 64 would
// be 4 per CPU on 16 CPUs, below what 2 CPUs already showed to limit.
func defaultMaxConcurrentOperations() int {
	return max(64, 32*runtime.GOMAXPROCS(0))
}
