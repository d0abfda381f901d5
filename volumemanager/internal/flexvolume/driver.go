package flexvolume

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
	"k8s.io/utils/exec"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// pluginDirName is the kubelet's flexvolume plugin name, under which the
// device mounts are: {root}/plugins/kubernetes.io/flexvolume/{driver}/mounts.
const pluginDirName = "kubernetes.io/flexvolume"

// host is what every driver's plugin shares: the node and its root.
type host struct {
	root      string
	rfs       *rootfs.Root
	mounter   mount.Interface
	formatter *mount.SafeFormatAndMount
	exec      exec.Interface
	secrets   Secrets
	node      func() (*v1.Node, error)
	nodeName  string
	ownership fsgroup.Reporter
	// waitTimeout bounds waitforattach.
	waitTimeout time.Duration
}

// driver is the volume plugin of one flexVolume driver: the kubelet's
// flexVolumePlugin (and flexVolumeAttachablePlugin when its init says
// attach). Its name is the driver's ("vendor/driver"), so that its
// volumes' unique names are the kubelet's.
type driver struct {
	*host
	// name is "vendor/driver"; dirName its directory, "vendor~driver".
	name, dirName string
	// exe is {pluginDir}/{vendor~driver}/{driver}.
	exe  string
	caps capabilities

	mu sync.Mutex
	// unsupported are the commands the driver answered "Not supported"
	// to since its init.
	unsupported map[string]bool
}

var (
	_ volume.Plugin        = (*driver)(nil)
	_ volume.PVPlugin      = (*driver)(nil)
	_ volume.Attacher      = (*driver)(nil)
	_ volume.SelfAttacher  = (*driver)(nil)
	_ volume.DeviceMounter = (*driver)(nil)
	_ volume.StatsProvider = (*driver)(nil)
)

// escape and unescape turn a driver's name into its directory's and back,
// as the kubelet's EscapeQualifiedName does.
func escape(name string) string   { return strings.ReplaceAll(name, "/", "~") }
func unescape(name string) string { return strings.ReplaceAll(name, "~", "/") }

// Name implements volume.Plugin: the driver's name.
func (d *driver) Name() string { return d.name }

// CanSupport implements volume.Plugin: a flexVolume of this driver.
func (d *driver) CanSupport(v *v1.Volume) bool {
	return v != nil && v.FlexVolume != nil && v.FlexVolume.Driver == d.name
}

// CanSupportPV implements volume.PVPlugin: a flexVolume PV of this driver.
func (d *driver) CanSupportPV(pv *v1.PersistentVolume) bool {
	return pv != nil && pv.Spec.FlexVolume != nil && pv.Spec.FlexVolume.Driver == d.name
}

// Capabilities implements volume.Plugin: a driver that attaches has its
// volumes attached and staged; ownership is changed when the driver's
// init says fsGroup.
func (d *driver) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Attachable: d.caps.Attach, Stages: d.caps.Attach, OwnershipChange: d.caps.FSGroup}, nil
}

// podDir is the pod's directory of the volume:
// {root}/pods/{uid}/volumes/{vendor~driver}/{name}.
func (d *driver) podDir(uid types.UID, name string) (string, error) {
	if err := fsutil.ValidateName("pod UID", string(uid)); err != nil {
		return "", err
	}
	if err := fsutil.ValidateName("volume name", name); err != nil {
		return "", err
	}
	return filepath.Join(d.root, "pods", string(uid), "volumes", d.dirName, name), nil
}

// mountsDir holds the driver's device mounts.
func (d *driver) mountsDir() string {
	return filepath.Join(d.root, "plugins", pluginDirName, d.name, "mounts")
}

// deviceMountPath is where the volume named name (the PV's or the pod
// volume's) is staged.
func (d *driver) deviceMountPath(name string) (string, error) {
	if err := fsutil.ValidateName("volume name", name); err != nil {
		return "", err
	}
	return filepath.Join(d.mountsDir(), name), nil
}

// volumeName is the name the kubelet gives a volume of spec: the PV's, or
// the pod volume's (podVolume; for a node-scoped volume with no pod, the
// end of its unique name {driver}/{name}).
func (d *driver) volumeName(spec *podvol.VolumeSpec, podVolume string) string {
	if spec.PVName != "" {
		return spec.PVName
	}
	if podVolume != "" {
		return podVolume
	}
	return strings.TrimPrefix(string(spec.Name), d.name+"/")
}

// desc names a volume in errors: its name and the driver.
func (d *driver) desc(name string) string {
	return fmt.Sprintf("%q (flexVolume driver %s)", name, d.name)
}

// getVolumeName asks the driver for the volume's name, as the kubelet
// does before it computes a device mount path: the reply is not used (the
// kubelet uses the PV's or the volume's name), but a failure is an error.
func (d *driver) getVolumeName(ctx context.Context, s source) error {
	opts, err := s.json(nil)
	if err != nil {
		return err
	}
	if _, err := d.run(ctx, call{cmdGetVolumeName, []string{opts}}); err != nil && err != errNotSupported {
		return fmt.Errorf("GetVolumeName failed from getDeviceMountPath: %w", err)
	}
	return nil
}
