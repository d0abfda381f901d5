package adapter

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/volume"

	"github.com/nodevol/nodevol/podvol"
	nvolume "github.com/nodevol/nodevol/volume"
)

// The plugins whose volumes the kubelet does not manage, and never asks
// the runtime to relabel: a hostPath's files are the host's, an nfs
// export's the server's (the kubelet's nfs mounter says Managed and
// SELinuxRelabel false).
const (
	hostPathPlugin = "kubernetes.io/host-path"
	nfsPlugin      = "kubernetes.io/nfs"
)

// metricsTimeout bounds one GetMetrics (a NodeGetVolumeStats call for a CSI
// volume), as the kubelet's CSI plugin bounds its calls.
const metricsTimeout = 2 * time.Minute

// errNotSetUpHere is the error of the SetUp methods: nodevol sets volumes
// up in its own loop, never through the kubelet's mounter.
var errNotSetUpHere = errors.New("nodevol sets up the volumes of a pod itself: SetUp is not called through the kubelet")

// statsSource is how a volume's GetMetrics reads its usage.
type statsSource interface {
	GetVolumeStatsFor(ctx context.Context, uid types.UID, specName string) (nvolume.Stats, bool, error)
}

// volumeMap turns nodevol's mounted volumes of a pod into the kubelet's
// VolumeMap, keyed by the volume's name in pod.spec.volumes.
func volumeMap(stats statsSource, uid types.UID, vols []podvol.MountedVolume) kubecontainer.VolumeMap {
	out := make(kubecontainer.VolumeMap, len(vols))
	for _, mv := range vols {
		v := &mounted{stats: stats, uid: uid, mv: mv}
		info := kubecontainer.VolumeInfo{
			ReadOnly:            mv.ReadOnly,
			SELinuxLabeled:      mv.SELinuxContext != "",
			InnerVolumeSpecName: mv.DirName,
		}
		if mv.Block {
			info.BlockVolumeMapper = v
		} else {
			info.Mounter = v
		}
		out[mv.SpecName] = info
	}
	return out
}

// mounted is one mounted volume of a pod as the kubelet sees it: a
// volume.Mounter, or a volume.BlockVolumeMapper for a raw block volume. The
// kubelet reads its path and attributes to make the containers' mounts
// and its usage for the stats summary; it never sets it up.
type mounted struct {
	stats statsSource
	uid   types.UID
	mv    podvol.MountedVolume
}

var (
	_ volume.Mounter           = (*mounted)(nil)
	_ volume.BlockVolumeMapper = (*mounted)(nil)
)

// GetPath is where the volume is on the node for the pod's containers; ""
// for a volume the runtime provides (an image volume), as the kubelet's
// image plugin answers.
func (v *mounted) GetPath() string { return v.mv.Path }

// GetAttributes says what the kubelet tells the runtime about the
// volume: read-only, managed (every kind but hostPath and nfs), and
// whether the runtime must relabel it for SELinux (not when nodevol
// mounted it with the pod's context, nor a hostPath, an nfs or an image
// volume).
func (v *mounted) GetAttributes() volume.Attributes {
	managed := v.mv.Plugin != hostPathPlugin && v.mv.Plugin != nfsPlugin
	return volume.Attributes{
		ReadOnly:       v.mv.ReadOnly,
		Managed:        managed,
		SELinuxRelabel: managed && !v.mv.ProvidedByRuntime && v.mv.SELinuxContext == "",
	}
}

// SetUp refuses: nodevol sets the volume up (errNotSetUpHere).
func (v *mounted) SetUp(volume.MounterArgs) error { return errNotSetUpHere }

// SetUpAt refuses: nodevol sets the volume up (errNotSetUpHere).
func (v *mounted) SetUpAt(string, volume.MounterArgs) error { return errNotSetUpHere }

// GetGlobalMapPath is not known to the kubelet's side: nodevol keeps the
// device's staging and global map paths.
func (v *mounted) GetGlobalMapPath(*volume.Spec) (string, error) {
	return "", errors.New("nodevol keeps the global map path of a block volume")
}

// GetPodDeviceMapPath returns the directory and name of the pod's symlink
// to the block device (volumeDevices/kubernetes.io~csi/{name}).
func (v *mounted) GetPodDeviceMapPath() (string, string) {
	return filepath.Dir(v.mv.Path), filepath.Base(v.mv.Path)
}

// SupportsMetrics says GetMetrics answers for a block volume.
func (v *mounted) SupportsMetrics() bool { return true }

// GetMetrics returns the volume's usage, as its plugin reports it (a CSI
// driver's NodeGetVolumeStats, an emptyDir's disk usage). A volume whose
// plugin reports none gets volume.NewNotSupportedError, as the kubelet's
// plugins without metrics return.
func (v *mounted) GetMetrics() (*volume.Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), metricsTimeout)
	defer cancel()
	s, ok, err := v.stats.GetVolumeStatsFor(ctx, v.uid, v.mv.SpecName)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, volume.NewNotSupportedError()
	}
	return &volume.Metrics{
		Time:       metav1.Now(),
		Capacity:   quantity(s.CapacityBytes),
		Available:  quantity(s.AvailableBytes),
		Used:       quantity(s.UsedBytes),
		Inodes:     quantity(s.Inodes),
		InodesFree: quantity(s.InodesFree),
		InodesUsed: quantity(s.InodesUsed),
	}, nil
}

// quantity is a count as the kubelet's stats want it: a count the plugin
// did not report (-1) is 0, as a CSI answer without it reads.
func quantity(n int64) *resource.Quantity {
	return resource.NewQuantity(max(n, 0), resource.BinarySI)
}
