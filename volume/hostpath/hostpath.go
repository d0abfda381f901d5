// Package hostpath is the volume plugin of hostPath volumes: pod volumes
// with a hostPath source and PersistentVolumes with spec.hostPath. A
// hostPath volume is a path on the node that the container runtime
// bind-mounts into the containers; nodevol mounts nothing for it.
//
// It does what the kubelet's kubernetes.io/host-path plugin does on the
// node: the volume's unique name is the pod-scoped {plugin}/{podUID}-{name};
// SetUp refuses a path with a ".." element, then runs the kubelet's type
// check (DirectoryOrCreate makes the directory and its missing parents with
// mode 0755, FileOrCreate makes an empty file with mode 0644 in an existing
// directory, both less the process's umask as in the kubelet; Directory,
// File, Socket, CharDevice and BlockDevice must exist and be of that type;
// an unset type checks nothing), with the kubelet's error texts, and
// returns the host path itself; TearDown does nothing; the volume gets no
// fsGroup ownership change, no SELinux relabelling, no mount options, no
// stats and no expansion, and it is never a raw block device. Nothing is
// left under the kubelet's root (the kubelet makes no directory under
// pods/{uid}/volumes for it either), so there is nothing to reconstruct
// after a restart: a running pod's volume is set up again, which is
// idempotent.
//
// Unlike the paths below nodevol's root, a host path is followed as the
// kubelet follows it: symlinks in any component, the last one included,
// are resolved by the type check and by the creation of a missing
// directory or file. A host path is outside the root by definition and is
// whatever the pod's author (allowed by admission to use hostPath) names,
// so the root's confinement (internal/rootfs) cannot apply to it.
//
// What it does not do: the kubelet's recycler, deleter and provisioner
// (controller-side, for tests and single-node clusters). It checks more
// than the kubelet in three places: a relative path is refused when the
// pod is resolved (the kubelet would resolve it against its working
// directory); a DirectoryOrCreate that could not make its directory is an
// error rather than a silent success (the kubelet's MkdirAll ignores "file
// exists" even when what exists is a dangling symlink, at the path or
// above it); and a path that cannot be examined (stat fails otherwise than
// with "does not exist", as on a symlink loop) is reported by the type
// check instead of being created over.
package hostpath

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/host-path"

// Config configures the hostPath plugin.
type Config struct {
	// Steps sees each directory and file the plugin is about to create on
	// the host (step.Mkdir, step.Create); nil takes every step.
	Steps step.Hook
}

// New returns the hostPath plugin.
func New(cfg Config) (volume.Plugin, error) {
	return &plugin{steps: cfg.Steps, stat: os.Stat}, nil
}

type plugin struct {
	steps step.Hook
	// stat is os.Stat; tests replace it to show a block device where the
	// machine has none.
	stat func(string) (fs.FileInfo, error)
}

var (
	_ volume.Plugin       = (*plugin)(nil)
	_ volume.PVPlugin     = (*plugin)(nil)
	_ volume.SpecResolver = (*plugin)(nil)
)

// Name implements volume.Plugin.
func (*plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with a hostPath source.
func (*plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.HostPath != nil }

// CanSupportPV implements volume.PVPlugin: PVs with spec.hostPath.
func (*plugin) CanSupportPV(pv *v1.PersistentVolume) bool {
	return pv != nil && pv.Spec.HostPath != nil
}

// Capabilities implements volume.Plugin: a host path is neither attached
// nor staged, never a raw block device, never published again, and its
// ownership is the host's (the kubelet does not apply fsGroup to it).
func (*plugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{}, nil
}

// knownTypes are the hostPath types the API and the kubelet accept.
var knownTypes = []v1.HostPathType{
	v1.HostPathUnset, v1.HostPathDirectoryOrCreate, v1.HostPathDirectory,
	v1.HostPathFileOrCreate, v1.HostPathFile, v1.HostPathSocket,
	v1.HostPathCharDev, v1.HostPathBlockDev,
}

// ResolveSpec implements volume.SpecResolver: it refuses, for good, a
// source the kubelet would never set up: no path, a relative path, a path
// with a ".." element (the API's and the kubelet's check), a type the
// kubelet does not know, or a PV of volumeMode Block (the kubelet's
// hostPath plugin maps no block devices).
func (p *plugin) ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error {
	if spec == nil {
		return fmt.Errorf("hostPath volume of pod %s: no spec", podName(pod))
	}
	src := sourceOf(spec)
	if src == nil {
		return fmt.Errorf("%s of pod %s: no hostPath source", describe(pod, spec), podName(pod))
	}
	fail := func(cause string) error {
		return fmt.Errorf("%s of pod %s, path %q: %s", describe(pod, spec), podName(pod), src.Path, cause)
	}
	switch {
	case src.Path == "":
		return fail("no path")
	case !filepath.IsAbs(src.Path):
		return fail("the path must be absolute")
	}
	if err := noBacksteps(src.Path); err != nil {
		return fail(err.Error())
	}
	if t := typeOf(src); !slices.Contains(knownTypes, t) {
		return fail(fmt.Sprintf("unknown type %q (known: %s)", t, typeList()))
	}
	if spec.Mode == podvol.Block {
		return fail("a hostPath volume cannot be used as a raw block device (volumeMode Block)")
	}
	return nil
}

// SetUp implements volume.Mounter: it checks (and for the *OrCreate types
// makes) the host path as the kubelet does and returns it; the runtime
// bind-mounts it into the containers, read-only where the pod says so.
// A path of the wrong type is an error naming what was found, retried by
// the caller (the path may appear or change); nothing is ever half-done
// (a directory made of a DirectoryOrCreate's missing parents stays, as
// with the kubelet, and the next SetUp goes on from it), so no error is
// Uncertain.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	src := sourceOf(req.Spec)
	if src == nil {
		return "", fmt.Errorf("setting up %s: no hostPath source", describeReq(req))
	}
	if err := noBacksteps(src.Path); err != nil {
		return "", fmt.Errorf("setting up %s: %w", describeReq(req), volume.Causef("invalid HostPath `%s`: %w", src.Path, err))
	}
	t := typeOf(src)
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("setting up %s: %w", describeReq(req), err)
	}
	if err := p.check(src.Path, t); err != nil {
		// check's errors are the kubelet's words (type checks, the
		// system's errors of a create).
		return "", fmt.Errorf("setting up %s (type %s): %w", describeReq(req), t, volume.Cause(err))
	}
	return src.Path, nil
}

// TearDown implements volume.Mounter: there is nothing to undo on the host
// (what DirectoryOrCreate and FileOrCreate made stays, as with the
// kubelet), and nothing under the kubelet's root. It works without the
// spec's source.
func (*plugin) TearDown(context.Context, volume.MountRequest) error { return nil }

// sourceOf returns spec's hostPath source: the pod volume's or the PV's.
func sourceOf(spec *podvol.VolumeSpec) *v1.HostPathVolumeSource {
	switch {
	case spec == nil:
		return nil
	case spec.Source != nil && spec.Source.HostPath != nil:
		return spec.Source.HostPath
	case spec.PVSource != nil && spec.PVSource.HostPath != nil:
		return spec.PVSource.HostPath
	}
	return nil
}

func typeOf(src *v1.HostPathVolumeSource) v1.HostPathType {
	if src.Type == nil {
		return v1.HostPathUnset
	}
	return *src.Type
}

func typeList() string {
	names := make([]string, 0, len(knownTypes))
	for _, t := range knownTypes {
		names = append(names, fmt.Sprintf("%q", t))
	}
	return strings.Join(names, ", ")
}

// noBacksteps refuses a path with a ".." element, as the API's validation
// and the kubelet's SetUp both do (with this text).
func noBacksteps(path string) error {
	if slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "..") {
		return fmt.Errorf("must not contain '..'")
	}
	return nil
}

// describe names the volume of spec, a volume of pod, for messages: the
// PV (and the pod's volume of its claim), or the pod's volume name (the
// end of the pod-scoped unique name {plugin}/{podUID}-{name}).
func describe(pod *v1.Pod, spec *podvol.VolumeSpec) string {
	if spec.PVName != "" {
		if pod != nil && spec.Claim != "" {
			_, claim, _ := strings.Cut(spec.Claim, "/")
			for _, v := range pod.Spec.Volumes {
				if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
					return fmt.Sprintf("hostPath volume %q (PV %s)", v.Name, spec.PVName)
				}
			}
		}
		return fmt.Sprintf("hostPath PV %s", spec.PVName)
	}
	name := string(spec.Name)
	if pod != nil {
		name = strings.TrimPrefix(name, PluginName+"/"+string(pod.UID)+"-")
	}
	return fmt.Sprintf("hostPath volume %q", name)
}

func describeReq(req volume.MountRequest) string {
	if req.Volume.SpecName != "" {
		if req.Spec != nil && req.Spec.PVName != "" {
			return fmt.Sprintf("hostPath volume %q (PV %s) of pod %s", req.Volume.SpecName, req.Spec.PVName, req.Volume.Pod)
		}
		return fmt.Sprintf("hostPath volume %q of pod %s", req.Volume.SpecName, req.Volume.Pod)
	}
	if req.Spec == nil {
		return fmt.Sprintf("hostPath volume of pod %s", req.Volume.Pod)
	}
	return fmt.Sprintf("%s of pod %s", describe(nil, req.Spec), req.Volume.Pod)
}

func podName(pod *v1.Pod) string {
	if pod == nil {
		return "(none)"
	}
	return podvol.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}.String()
}
