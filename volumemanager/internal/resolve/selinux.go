package resolve

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

	"github.com/nodevol/nodevol/podvol"
)

// SELinux mount contexts, as the kubelet of Kubernetes 1.37 gives them
// with its default feature gates (SELinuxMountReadWriteOncePod,
// SELinuxChangePolicy and SELinuxMount all GA and on): a volume is mounted
// with -o context=<label> (NodeStageVolume and NodePublishVolume get
// `context="<label>"` in their mount flags, another plugin the label in
// its MountRequest) when
//
//   - the host has SELinux enabled (Config.SELinuxEnabled),
//   - the volume's plugin mounts with a context: for CSI, the CSIDriver
//     sets seLinuxMount: true; another plugin says so in its
//     Capabilities.SELinuxMount (none of nodevol's own does, as none of the
//     kubelet's emptyDir, hostPath, local, nfs, image, configMap, secret,
//     downwardAPI and projected plugins does),
//   - the volume is a PersistentVolume of any access mode (ReadWriteOnce,
//     ReadOnlyMany, ReadWriteMany or ReadWriteOncePod), or an inline
//     volume that CSI migration translates to one; inline CSI volumes and
//     other inline volumes never are,
//   - the containers that mount it run with an SELinux label (their own
//     seLinuxOptions, else the pod's), the same label for all of them,
//   - and the pod's seLinuxChangePolicy is not Recursive.
//
// Containers of a pod that disagree on a PV's label, or a label that
// cannot be made, make the pod wait with an error; on an inline volume
// they are only counted (the kubelet's *_warnings_total metrics). A volume
// is mounted with one context at a time: a pod that would mount it with
// another context than the pods that already use it (a Recursive pod's,
// or a pod's with no label, is "") waits, with a *SELinuxConflictError,
// until they are gone (the planner's admitSELinux).

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
	// PluginSupport: the volume's plugin mounts with a context (CSI: its
	// CSIDriver sets seLinuxMount: true; another: Capabilities.SELinuxMount).
	PluginSupport bool
	// PV: the volume is a PersistentVolume (or an inline volume that CSI
	// migration translates to one), the kubelet's VolumeSupportsSELinuxMount
	// with SELinuxMount on: every access mode.
	PV bool
	// Recursive: the pod's seLinuxChangePolicy is Recursive.
	Recursive bool
	// Containers are the effective seLinuxOptions of every container that
	// mounts the volume (nil: the container has none).
	Containers []*v1.SELinuxOptions
}

// SELinuxProblem is why a pod's containers give a volume no label.
type SELinuxProblem int

// The zero SELinuxProblem is none.
const (
	// SELinuxBadOptions: a container's options make no label (the
	// kubelet's volume_manager_selinux_container_* metrics).
	SELinuxBadOptions SELinuxProblem = iota + 1
	// SELinuxContainersDisagree: the containers that mount the volume have
	// different labels (volume_manager_selinux_pod_context_mismatch_*).
	SELinuxContainersDisagree
)

// seLinuxMount is what seLinuxMountContext decides for one pod volume.
type seLinuxMount struct {
	// Context is the context the pod mounts the volume with, "" for none.
	Context string
	// Label is the context it would mount with were it a PV: the kubelet
	// counts a volume that has one as admitted
	// (volume_manager_selinux_volumes_admitted_total), inline or not.
	Label string
	// Problem is why the containers give no label; an error for a PV,
	// only counted (a warning) for an inline volume.
	Problem SELinuxProblem
}

// seLinuxMountContext decides the context the pod mounts the volume with,
// following the kubelet's GetMountSELinuxLabel and
// VolumeSupportsSELinuxMount with SELinuxMount on. Containers that
// disagree, or options that make no label, are an error for a PV, whatever
// the plugin and the change policy (the kubelet checks them first), and a
// warning (no context, Problem set) for an inline volume.
func seLinuxMountContext(in seLinuxMountInput) (seLinuxMount, error) {
	if !in.HostEnabled {
		return seLinuxMount{}, nil
	}
	var labels []string
	for _, opts := range in.Containers {
		l, err := seLinuxFileLabel(opts)
		if err != nil {
			if !in.PV {
				return seLinuxMount{Problem: SELinuxBadOptions}, nil
			}
			return seLinuxMount{Problem: SELinuxBadOptions}, err
		}
		if l != "" && !slices.Contains(labels, l) {
			labels = append(labels, l)
		}
	}
	switch {
	case len(labels) > 1:
		if !in.PV {
			return seLinuxMount{Problem: SELinuxContainersDisagree}, nil
		}
		sort.Strings(labels)
		return seLinuxMount{Problem: SELinuxContainersDisagree},
			fmt.Errorf("the containers that mount it have different SELinux labels: %s", strings.Join(labels, ", "))
	case len(labels) == 0, in.Recursive, !in.PluginSupport, labels[0] == seLinuxNoLevel:
		return seLinuxMount{}, nil
	}
	out := seLinuxMount{Label: labels[0]}
	if in.PV {
		out.Context = labels[0]
	}
	return out, nil
}

// containerSELinuxOptions returns the effective seLinuxOptions of every
// container (init, regular and ephemeral) that mounts a volume named one
// of specNames: the container's own when it sets any, else the pod's, as
// the kubelet's DetermineEffectiveSecurityContext gives them. Containers
// with neither are left out.
func containerSELinuxOptions(pod *v1.Pod, specNames ...string) []*v1.SELinuxOptions {
	var podOpts *v1.SELinuxOptions
	if sc := pod.Spec.SecurityContext; sc != nil {
		podOpts = sc.SELinuxOptions
	}
	var out []*v1.SELinuxOptions
	visit := func(mounts []v1.VolumeMount, sc *v1.SecurityContext) {
		if !slices.ContainsFunc(mounts, func(m v1.VolumeMount) bool { return slices.Contains(specNames, m.Name) }) {
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

// seLinuxMount decides the context the pod mounts its volume spec with,
// which its volumes specNames all resolve to, and counts what the kubelet
// counts of it. The pod mounts the volume once, so the containers that
// mount any of the names must agree; the kubelet takes the label of the
// containers of the first name it adds, and mounts the others' with it
// whatever their label.
func (r *Resolver) seLinuxMount(pod *v1.Pod, specNames []string, spec podvol.VolumeSpec) (seLinuxMount, error) {
	if !r.SELinuxEnabled || spec.Mode == podvol.Block {
		// A raw block volume has no mount, and the kubelet takes no
		// label from volumeDevices.
		return seLinuxMount{}, nil
	}
	support, err := r.seLinuxSupport(&spec)
	if err != nil {
		return seLinuxMount{}, err
	}
	in := seLinuxMountInput{HostEnabled: true, PluginSupport: support, PV: spec.PVName != "",
		Containers: containerSELinuxOptions(pod, specNames...)}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.SELinuxChangePolicy != nil {
		in.Recursive = *sc.SELinuxChangePolicy == v1.SELinuxChangePolicyRecursive
	}
	m, err := seLinuxMountContext(in)
	if r.Metrics != nil {
		r.Metrics.SELinuxProblem(m.Problem, err != nil, AccessModeLabel(&spec))
	}
	if err != nil {
		return m, fmt.Errorf("volume %s (%s) cannot be mounted with an SELinux context: %w", spec.Name, SELinuxPluginLabel(&spec), err)
	}
	return m, nil
}

// seLinuxSupport reports whether the volume's plugin mounts it with a
// context: a CSI volume when its CSIDriver sets seLinuxMount (no CSIDriver:
// no), another when its plugin's Capabilities say so.
func (r *Resolver) seLinuxSupport(spec *podvol.VolumeSpec) (bool, error) {
	if spec.Plugin != "" {
		p, err := r.Plugins.ForVolume(spec.Name)
		if err != nil {
			return false, err
		}
		caps, err := p.Capabilities(spec)
		if err != nil {
			return false, fmt.Errorf("capabilities of volume %s: %w", spec.Name, err)
		}
		return caps.SELinuxMount, nil
	}
	if r.CSIDrivers == nil {
		return false, nil
	}
	d, err := r.CSIDrivers.Get(spec.Driver)
	switch {
	case err == nil:
		return d.Spec.SELinuxMount != nil && *d.Spec.SELinuxMount, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("CSIDriver %s: %w", spec.Driver, err)
}

// HostSELinuxEnabled reports whether the host has SELinux enabled, as
// go-selinux's GetEnabled decides: selinuxfs is mounted read-write at
// /sys/fs/selinux and this process has a label other than "kernel".
func HostSELinuxEnabled() bool {
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

// SELinuxPluginLabel is the kubelet's volume_plugin label of its SELinux
// metrics: "kubernetes.io/csi/{driver}" for a CSI volume (a slash, not
// volume_manager_total_volumes' colon), the plugin's name for another.
func SELinuxPluginLabel(spec *podvol.VolumeSpec) string {
	if spec.Plugin != "" {
		return spec.Plugin
	}
	return podvol.CSIPluginName + "/" + spec.Driver
}

// AccessModeLabel is the kubelet's access_mode label of its SELinux
// metrics: "inline" for a volume that is no PV, else the widest of the
// PV's access modes (RWX, then ROX, RWO, RWOP), "" for a PV with none.
func AccessModeLabel(spec *podvol.VolumeSpec) string {
	if spec.PVName == "" {
		return "inline"
	}
	for _, m := range []struct {
		mode  v1.PersistentVolumeAccessMode
		label string
	}{{v1.ReadWriteMany, "RWX"}, {v1.ReadOnlyMany, "ROX"}, {v1.ReadWriteOnce, "RWO"}, {v1.ReadWriteOncePod, "RWOP"}} {
		if slices.Contains(spec.AccessModes, m.mode) {
			return m.label
		}
	}
	return ""
}
