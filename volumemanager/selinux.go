package volumemanager

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodevol/nodevol/cache"
)

// SELinux mount contexts, as the kubelet of Kubernetes 1.33 gives them with
// its default feature gates (SELinuxMountReadWriteOncePod on, SELinuxMount
// off, SELinuxChangePolicy on): a volume is mounted with -o context=<label>
// (NodeStageVolume and NodePublishVolume get `context="<label>"` in their
// mount flags) when
//
//   - the host has SELinux enabled (Config.SELinuxEnabled),
//   - the volume's CSIDriver sets seLinuxMount: true,
//   - the volume is a PersistentVolume whose only access mode is
//     ReadWriteOncePod (inline CSI volumes never are),
//   - the containers that mount it run with an SELinux label (their own
//     seLinuxOptions, else the pod's), the same label for all of them,
//   - and the pod's seLinuxChangePolicy is not Recursive.
//
// A volume is mounted with one context at a time: a pod that would mount it
// with another context than the pods that already use it waits, with a
// *SELinuxConflictError, until they are gone.

// seLinuxFile are the parts of a file label that the kubelet's translator
// (label.InitLabels) takes from the host's container file context, the
// "file" entry of /etc/selinux/targeted/contexts/lxc_contexts:
// system_u:object_r:container_file_t:s0 on Fedora, RHEL and CentOS. Only
// the user and the level of a container's options reach the file label;
// its role and type label the process, not its files.
var seLinuxFile = struct{ User, Role, Type string }{"system_u", "object_r", "container_file_t"}

// seLinuxNoLevel stands for the label of a container whose options set no
// level: the kubelet's translator picks a random MCS level for it (another
// one at each call), which neither the container runtime nor another pod
// would share. nodevol mounts such a volume with no context, but counts
// the label as one of its own when containers disagree.
const seLinuxNoLevel = "<random level>"

var (
	seLinuxUserRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	seLinuxLevelRE = regexp.MustCompile(`^[A-Za-z0-9_.,:-]+$`)
)

// seLinuxFileLabel returns the SELinux file label of a container process
// that runs with opts: "" when opts sets nothing, seLinuxNoLevel when it
// sets no level, else user:role:type:level with the user defaulted and the
// role and type of seLinuxFile. A user or level that could not be part of
// a label (or would break the quoting of the mount option) is an error.
func seLinuxFileLabel(opts *v1.SELinuxOptions) (string, error) {
	if opts == nil || *opts == (v1.SELinuxOptions{}) {
		return "", nil
	}
	user := seLinuxFile.User
	if opts.User != "" {
		if !seLinuxUserRE.MatchString(opts.User) {
			return "", fmt.Errorf("invalid seLinuxOptions.user %q", opts.User)
		}
		user = opts.User
	}
	if opts.Level == "" {
		return seLinuxNoLevel, nil
	}
	if !seLinuxLevelRE.MatchString(opts.Level) {
		return "", fmt.Errorf("invalid seLinuxOptions.level %q", opts.Level)
	}
	return strings.Join([]string{user, seLinuxFile.Role, seLinuxFile.Type, opts.Level}, ":"), nil
}

// seLinuxMountInput is what decides the context a pod mounts a volume with.
type seLinuxMountInput struct {
	// HostEnabled: the host has SELinux enabled.
	HostEnabled bool
	// DriverSupport: the volume's CSIDriver sets seLinuxMount: true.
	DriverSupport bool
	// AccessModes are the PV's access modes; nil for an inline volume.
	AccessModes []v1.PersistentVolumeAccessMode
	// Recursive: the pod's seLinuxChangePolicy is Recursive.
	Recursive bool
	// Containers are the effective seLinuxOptions of every container that
	// mounts the volume (nil: the container has none).
	Containers []*v1.SELinuxOptions
}

// seLinuxMountContext returns the context the pod mounts the volume with,
// "" for none, following the kubelet's GetMountSELinuxLabel and
// VolumeSupportsSELinuxMount. Containers that disagree are an error only
// for a volume the context mount applies to by its access mode (for
// others the kubelet only counts a warning metric).
func seLinuxMountContext(in seLinuxMountInput) (string, error) {
	if !in.HostEnabled {
		return "", nil
	}
	// SELinuxMountReadWriteOncePod without SELinuxMount: a PV whose one
	// access mode is ReadWriteOncePod.
	applies := len(in.AccessModes) == 1 && in.AccessModes[0] == v1.ReadWriteOncePod
	var labels []string
	for _, opts := range in.Containers {
		l, err := seLinuxFileLabel(opts)
		if err != nil {
			if !applies {
				return "", nil
			}
			return "", err
		}
		if l != "" && !slices.Contains(labels, l) {
			labels = append(labels, l)
		}
	}
	switch {
	case len(labels) > 1 && applies:
		sort.Strings(labels)
		return "", fmt.Errorf("the containers that mount it have different SELinux labels: %s", strings.Join(labels, ", "))
	case len(labels) != 1, in.Recursive, !in.DriverSupport, !applies, labels[0] == seLinuxNoLevel:
		return "", nil
	}
	return labels[0], nil
}

// containerSELinuxOptions returns the effective seLinuxOptions of every
// container (init, regular and ephemeral) that mounts the volume named
// specName: the container's own when it sets any, else the pod's, as
// the kubelet's DetermineEffectiveSecurityContext gives them. Containers
// with neither are left out.
func containerSELinuxOptions(pod *v1.Pod, specName string) []*v1.SELinuxOptions {
	var podOpts *v1.SELinuxOptions
	if sc := pod.Spec.SecurityContext; sc != nil {
		podOpts = sc.SELinuxOptions
	}
	var out []*v1.SELinuxOptions
	visit := func(mounts []v1.VolumeMount, sc *v1.SecurityContext) {
		if !slices.ContainsFunc(mounts, func(m v1.VolumeMount) bool { return m.Name == specName }) {
			return
		}
		opts := podOpts
		if sc != nil && sc.SELinuxOptions != nil {
			opts = sc.SELinuxOptions
		}
		if opts != nil {
			out = append(out, opts)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		visit(c.VolumeMounts, c.SecurityContext)
	}
	for _, c := range pod.Spec.Containers {
		visit(c.VolumeMounts, c.SecurityContext)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		visit(c.VolumeMounts, c.SecurityContext)
	}
	return out
}

// seLinuxLabel returns the context the pod mounts its volume specName
// (resolved to spec) with.
func (r *resolver) seLinuxLabel(pod *v1.Pod, specName string, spec cache.VolumeSpec) (string, error) {
	if !r.seLinuxEnabled || spec.Mode == cache.Block || spec.Plugin != "" {
		// A mount context is a CSI driver's feature (its CSIDriver's
		// seLinuxMount); the image plugin, like the kubelet's, has none.
		return "", nil
	}
	in := seLinuxMountInput{HostEnabled: true, Containers: containerSELinuxOptions(pod, specName)}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.SELinuxChangePolicy != nil {
		in.Recursive = *sc.SELinuxChangePolicy == v1.SELinuxChangePolicyRecursive
	}
	if r.csiDrivers != nil {
		d, err := r.csiDrivers.Get(spec.Driver)
		switch {
		case err == nil:
			in.DriverSupport = d.Spec.SELinuxMount != nil && *d.Spec.SELinuxMount
		case !apierrors.IsNotFound(err):
			return "", fmt.Errorf("CSIDriver %s: %w", spec.Driver, err)
		}
	}
	if spec.PVName != "" {
		pv, err := r.pvs.Get(spec.PVName)
		if err != nil {
			return "", fmt.Errorf("PV %s: %w", spec.PVName, err)
		}
		in.AccessModes = pv.Spec.AccessModes
	}
	label, err := seLinuxMountContext(in)
	if err != nil {
		return "", fmt.Errorf("volume %s (driver %s) cannot be mounted with an SELinux context: %w", spec.Name, spec.Driver, err)
	}
	return label, nil
}

// hostSELinuxEnabled reports whether the host has SELinux enabled, as
// go-selinux's GetEnabled decides: selinuxfs is mounted read-write at
// /sys/fs/selinux and this process has a label other than "kernel".
func hostSELinuxEnabled() bool {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/selinux", &st); err != nil {
		return false
	}
	if uint32(st.Type) != uint32(unix.SELINUX_MAGIC) || st.Flags&unix.ST_RDONLY != 0 {
		return false
	}
	b, err := os.ReadFile("/proc/self/attr/current")
	if err != nil {
		return false
	}
	label := strings.TrimRight(string(b), "\x00\n")
	return label != "" && label != "kernel"
}
