package resolve

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"

	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// Resolver turns a pod's volumes into desired volumes: it asks Plugins
// which plugin handles each, and reads the claims and volumes through
// listers (the informers', or the object cache's: Listers), never a GET
// per pod. Its fields are set once, before the first Resolve.
type Resolver struct {
	Plugins *volume.Registry
	PVCs    corelisters.PersistentVolumeClaimLister
	PVs     corelisters.PersistentVolumeLister
	// CSIDrivers and SELinuxEnabled decide the SELinux context of each
	// pod's mount (selinux.go); without them there is none.
	CSIDrivers     storagelisters.CSIDriverLister
	SELinuxEnabled bool
	// Metrics counts the SELinux problems the kubelet counts (nil: none).
	Metrics Metrics
	// Node returns this node's Node (Config.Node): PVs' node affinity.
	Node func() (*v1.Node, error)
	// Readers are asked what each pod volume reads (PodObjects): the
	// plugins that are volume.ObjectReaders (ObjectReaders) and the
	// flexVolume drivers. The pod holds those objects in the object cache.
	Readers []volume.ObjectReader
}

// Metrics counts what resolution meets that the kubelet counts.
type Metrics interface {
	// SELinuxProblem counts a pod volume whose containers give it no
	// label: an error when the pod waits for it (failed), else a warning;
	// accessMode is AccessModeLabel's.
	SELinuxProblem(p SELinuxProblem, failed bool, accessMode string)
}

// PodVolume is a pod volume that a container mounts or maps, with the
// plugin that handles it (nil when err says why none does).
type PodVolume struct {
	v1.Volume
	plugin volume.Plugin
	// block: a container uses it as a raw block device (volumeDevices).
	block bool
	// err is set when the volume's source is claimed by more than one
	// plugin, or by none.
	err error
}

// PodVolumes returns, in spec order, the pod's volumes that a container
// mounts or maps (only those count, as in the kubelet), each with the
// plugin plugins finds for its source (Registry.ForSource). A volume no
// plugin handles carries its error (ErrUnknownSource, final): a kind
// nodevol does not handle is never a silent success. A flexVolume whose
// driver is not found is an error that is not final: its driver may come.
func PodVolumes(pod *v1.Pod, plugins *volume.Registry) []PodVolume {
	mounts, devices := map[string]bool{}, map[string]bool{}
	visit := func(cs []v1.Container) {
		for _, c := range cs {
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = true
			}
			for _, d := range c.VolumeDevices {
				devices[d.Name] = true
			}
		}
	}
	visit(pod.Spec.InitContainers)
	visit(pod.Spec.Containers)
	for _, ec := range pod.Spec.EphemeralContainers {
		for _, m := range ec.VolumeMounts {
			mounts[m.Name] = true
		}
	}
	var vols []PodVolume
	for _, v := range pod.Spec.Volumes {
		if !mounts[v.Name] && !devices[v.Name] {
			continue
		}
		p, err := plugins.ForSource(&v)
		switch {
		case err == nil:
		case v.FlexVolume != nil && errors.Is(err, volume.ErrNoPlugin):
			// Not final, as in the kubelet: the driver may be installed
			// in the plugin directory yet, and the pod is resolved again
			// when it is (pluginsChanged).
			err = fmt.Errorf("%w: flexVolume driver %q not found (yet) in the volume plugin directory", err, v.FlexVolume.Driver)
		default:
			err = marked{err, planner.ErrUnknownSource}
		}
		vols = append(vols, PodVolume{Volume: v, plugin: p, block: devices[v.Name], err: err})
	}
	return vols
}

// ResolvePod resolves every pod volume that a plugin handles. wanted
// lists them all by spec name; errs says why some could not be resolved.
func (r *Resolver) ResolvePod(pod *v1.Pod) (ref podvol.PodRef, wanted []string, resolved []state.DesiredVolume, errs map[string]error) {
	ref = PodRef(pod)
	errs = map[string]error{}
	vols := PodVolumes(pod, r.Plugins)
	for i := range vols {
		v := &vols[i]
		wanted = append(wanted, v.Name)
		dv, err := state.DesiredVolume{}, v.err
		if err == nil {
			dv, err = r.resolveVolume(pod, v)
		}
		if err != nil {
			errs[v.Name] = fmt.Errorf("pod %s volume %q: %w", ref, v.Name, err)
			continue
		}
		dv.Volume.Pod = ref
		resolved = append(resolved, dv)
	}
	// The SELinux context once every name is resolved: names of one
	// volume (a PVC in two of the pod's volumes) share its one mount, and
	// with it the context of every container that mounts either.
	kept := make([]state.DesiredVolume, 0, len(resolved))
	for _, dv := range resolved {
		m, err := r.seLinuxMount(pod, sameVolumeNames(resolved, dv), dv.Spec)
		if err != nil {
			errs[dv.Volume.SpecName] = fmt.Errorf("pod %s volume %q: %w", ref, dv.Volume.SpecName, err)
			continue
		}
		dv.Volume.SELinuxLabel, dv.SELinuxAdmitted = m.Context, m.Label != ""
		kept = append(kept, dv)
	}
	return ref, wanted, kept, errs
}

// sameVolumeNames returns the spec names of resolved that are dv's volume
// (dv's own among them).
func sameVolumeNames(resolved []state.DesiredVolume, dv state.DesiredVolume) []string {
	var names []string
	for _, o := range resolved {
		if o.Spec.Name == dv.Spec.Name {
			names = append(names, o.Volume.SpecName)
		}
	}
	return names
}

// PodRef is the reference to pod the desired state keeps.
func PodRef(pod *v1.Pod) podvol.PodRef {
	return podvol.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, ServiceAccount: pod.Spec.ServiceAccountName}
}

// resolveVolume resolves a pod volume with its plugin: a claim (to a PV of
// the CSI plugin or of another plugin), a generic ephemeral volume, the
// CSI plugin's inline and migrated volumes (csiVolume), or a pod-scoped
// volume of another plugin (pluginSpec).
func (r *Resolver) resolveVolume(pod *v1.Pod, v *PodVolume) (state.DesiredVolume, error) {
	pv := podvol.PodVolume{SpecName: v.Name}
	if sc := pod.Spec.SecurityContext; sc != nil {
		pv.FSGroup = sc.FSGroup
		pv.FSGroupOnRootMismatch = sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy == v1.FSGroupChangeOnRootMismatch
	}
	var claim string
	var owner *v1.Pod
	switch {
	case v.PersistentVolumeClaim != nil:
		claim = v.PersistentVolumeClaim.ClaimName
		pv.ReadOnly = v.PersistentVolumeClaim.ReadOnly
	case v.Ephemeral != nil: // generic ephemeral volume: a PVC named after the pod and the volume
		claim, owner = pod.Name+"-"+v.Name, pod
	case v.plugin.Name() != podvol.CSIPluginName:
		spec := pluginSpec(pod, &v.Volume, v.plugin.Name())
		if caps, err := v.plugin.Capabilities(&spec); err == nil && (caps.Attachable || caps.Stages) {
			// Node-scoped, as the kubelet names an attachable or
			// device-mountable inline volume: {plugin}/{specName}.
			spec.Name, spec.Ephemeral = podvol.UniqueVolumeName(spec.Plugin+"/"+v.Name), false
		}
		if err := resolveSpec(v.plugin, pod, &spec); err != nil {
			return state.DesiredVolume{}, err
		}
		return state.DesiredVolume{Spec: spec, Volume: pv}, checkMode(spec, v.block)
	default:
		return r.csiVolume(pod, &v.Volume, v.block, pv)
	}
	spec, err := r.claimSpec(pod, claim, owner)
	if err != nil {
		return state.DesiredVolume{}, err
	}
	pv.ReadOnly = pv.ReadOnly || spec.ReadOnly
	pv.PVName = spec.PVName // this pod's PV, which may not be the one the volume's spec names
	return state.DesiredVolume{Spec: spec, Volume: pv}, checkMode(spec, v.block)
}

// resolveSpec lets p complete and check spec for pod, when it is a
// volume.SpecResolver: its error is final, unless it wraps
// volume.ErrNotReady (what it needs, the Node, is not known yet).
func resolveSpec(p volume.Plugin, pod *v1.Pod, spec *podvol.VolumeSpec) error {
	sr, ok := p.(volume.SpecResolver)
	if !ok {
		return nil
	}
	err := sr.ResolveSpec(pod, spec)
	if err != nil && !errors.Is(err, volume.ErrNotReady) {
		return marked{err, planner.ErrUnknownSource}
	}
	return err
}

// pluginSpec is the spec of a pod volume of another plugin than CSI:
// pod-scoped, named as the kubelet names a volume that is neither attached
// nor staged ({plugin}/{podUID}-{specName}), never attached or staged
// (Ephemeral), with the pod volume's source for the plugin. resolveVolume
// makes it node-scoped for a plugin that attaches or stages it.
func pluginSpec(pod *v1.Pod, v *v1.Volume, plugin string) podvol.VolumeSpec {
	return podvol.VolumeSpec{
		Name:      podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", plugin, pod.UID, v.Name)),
		Plugin:    plugin,
		Mode:      podvol.Filesystem,
		Ephemeral: true,
		Source:    v.VolumeSource.DeepCopy(),
	}
}

// csiVolume resolves an inline CSI volume or an inline volume of a
// migrated in-tree plugin.
func (r *Resolver) csiVolume(pod *v1.Pod, v *v1.Volume, asBlock bool, pv podvol.PodVolume) (state.DesiredVolume, error) {
	if v.CSI == nil { // an inline volume of a migrated in-tree plugin (the plugin's CanSupport)
		spec, err := migratedInlineSpec(pod, v)
		if err != nil {
			return state.DesiredVolume{}, err
		}
		pv.ReadOnly = spec.ReadOnly
		return state.DesiredVolume{Spec: spec, Volume: pv}, checkMode(spec, asBlock)
	}
	if asBlock {
		return state.DesiredVolume{}, fmt.Errorf("inline CSI volume cannot be used in volumeDevices")
	}
	if err := csi.ValidateDriverName(v.CSI.Driver); err != nil {
		return state.DesiredVolume{}, fmt.Errorf("inline CSI volume: %w", err)
	}
	return state.DesiredVolume{Spec: inlineSpec(pod, v), Volume: pv}, nil
}

func checkMode(spec podvol.VolumeSpec, asBlock bool) error {
	switch {
	case asBlock && spec.Mode != podvol.Block:
		return fmt.Errorf("volume has volumeMode %s, but is specified in volumeDevices", spec.Mode)
	case !asBlock && spec.Mode == podvol.Block:
		return fmt.Errorf("volume has volumeMode %s, but is specified in volumeMounts", spec.Mode)
	}
	return nil
}

// claimSpec follows pod's PVC claim to its bound PV and resolves that.
// owner, when set, must own the PVC (generic ephemeral volumes).
func (r *Resolver) claimSpec(pod *v1.Pod, claim string, owner *v1.Pod) (podvol.VolumeSpec, error) {
	ns := pod.Namespace
	// The lister's key is namespace/name: a slash in either would find
	// another namespace's claim (pod namespace a, claim b/c: claim c of
	// namespace a/b). The API server allows neither in a PVC; pods added
	// by the agent are not validated.
	if strings.Contains(ns, "/") || strings.Contains(claim, "/") {
		return podvol.VolumeSpec{}, fmt.Errorf("PVC %s/%s: invalid namespace or claim name (contains \"/\")", ns, claim)
	}
	pvc, err := r.PVCs.PersistentVolumeClaims(ns).Get(claim)
	if apierrors.IsNotFound(err) {
		return podvol.VolumeSpec{}, marked{fmt.Errorf("PVC %s/%s not found", ns, claim), planner.ErrClaimPending}
	} else if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PVC %s/%s: %w", ns, claim, err)
	}
	if owner != nil && !ownedBy(pvc, owner) {
		return podvol.VolumeSpec{}, fmt.Errorf("PVC %s/%s was not created for pod %s/%s (pod is not owner)", ns, claim, owner.Namespace, owner.Name)
	}
	if pvc.DeletionTimestamp != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PVC %s/%s is being deleted", ns, claim)
	}
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
		return podvol.VolumeSpec{}, marked{fmt.Errorf("PVC %s/%s is not bound (phase %q)", ns, claim, pvc.Status.Phase), planner.ErrClaimPending}
	}
	pv, err := r.PVs.Get(pvc.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s of PVC %s/%s not found", pvc.Spec.VolumeName, ns, claim)
	} else if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s: %w", pvc.Spec.VolumeName, err)
	}
	if pv.Spec.ClaimRef == nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s is not yet bound to PVC %s/%s", pv.Name, ns, claim)
	}
	if pv.Spec.ClaimRef.UID != pvc.UID {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s is bound to a different claim (uid %q, PVC %s/%s has %q)", pv.Name, pv.Spec.ClaimRef.UID, ns, claim, pvc.UID)
	}
	return r.volumeSpec(pod, pv)
}

// volumeSpec resolves a bound PV: its node affinity must match this node
// (the kubelet checks it before mounting any PV); a CSI PV, or one CSI
// migration translates, is the CSI plugin's; another is the PVPlugin's
// that claims it, named as the kubelet names it: {plugin}/{pvName} when
// the plugin attaches or stages it (node-scoped), else
// {plugin}/{podUID}-{pvName}, with the mount options the kubelet's in-tree
// plugins read (inTreeMountOptions).
func (r *Resolver) volumeSpec(pod *v1.Pod, pv *v1.PersistentVolume) (podvol.VolumeSpec, error) {
	if pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil {
		if r.Node == nil {
			return podvol.VolumeSpec{}, fmt.Errorf("PV %s: node affinity: %w", pv.Name, errNoNode)
		}
		node, err := r.Node()
		if err != nil {
			return podvol.VolumeSpec{}, fmt.Errorf("PV %s: node affinity: %w", pv.Name, err)
		}
		// Not final, as in the kubelet, which retries the mount: the
		// node's labels may change, and the pod is resolved again then.
		if err := checkNodeAffinity(pv, node); err != nil {
			return podvol.VolumeSpec{}, err
		}
	}
	if pv.Spec.CSI != nil || migratedPVPlugin(pv) != "" {
		return PVSpec(pv)
	}
	p, err := r.Plugins.ForPV(pv)
	if err != nil {
		return podvol.VolumeSpec{}, marked{err, planner.ErrUnknownSource}
	}
	spec := pvCommon(pv)
	spec.MountOptions = inTreeMountOptions(pv)
	spec.Plugin, spec.PVSource, spec.Ephemeral = p.Name(), pv.Spec.PersistentVolumeSource.DeepCopy(), true
	spec.Name = podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", spec.Plugin, pod.UID, pv.Name))
	if caps, err := p.Capabilities(&spec); err == nil && (caps.Attachable || caps.Stages) {
		spec.Name, spec.Ephemeral = podvol.UniqueVolumeName(spec.Plugin+"/"+pv.Name), false
	}
	return spec, resolveSpec(p, pod, &spec)
}

func ownedBy(pvc *v1.PersistentVolumeClaim, pod *v1.Pod) bool {
	for _, o := range pvc.OwnerReferences {
		if o.UID == pod.UID && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// PVSpec turns a CSI PV, or an in-tree PV that CSI migration translates,
// into a VolumeSpec.
func PVSpec(pv *v1.PersistentVolume) (podvol.VolumeSpec, error) {
	src := pv.Spec.CSI
	if src == nil {
		return migratedPVSpec(pv)
	}
	if src.Driver == "" || src.VolumeHandle == "" {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s: csi.driver and csi.volumeHandle must be set", pv.Name)
	}
	// The unique name is {driver}^{handle}: a "^" in the driver would let
	// two volumes share it (driver a^b, handle c and driver a, handle b^c),
	// and the desired state would give one's pods the other's spec.
	if err := csi.ValidateDriverName(src.Driver); err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s: %w", pv.Name, err)
	}
	spec := pvCommon(pv)
	spec.Name = podvol.CSIVolumeName(src.Driver, src.VolumeHandle)
	spec.Driver, spec.VolumeHandle, spec.FSType, spec.ReadOnly, spec.Attributes = src.Driver, src.VolumeHandle, src.FSType, src.ReadOnly, src.VolumeAttributes
	if r := src.NodeStageSecretRef; r != nil {
		spec.NodeStageSecret = &podvol.SecretRef{Namespace: r.Namespace, Name: r.Name}
	}
	if r := src.NodePublishSecretRef; r != nil {
		spec.NodePublishSecret = &podvol.SecretRef{Namespace: r.Namespace, Name: r.Name}
	}
	if r := src.NodeExpandSecretRef; r != nil {
		spec.NodeExpandSecret = &podvol.SecretRef{Namespace: r.Namespace, Name: r.Name}
	}
	return spec, nil
}

// pvCommon is what a PV's spec holds whatever its plugin: its name,
// claim, mode, access modes, mount options and GID annotation.
func pvCommon(pv *v1.PersistentVolume) podvol.VolumeSpec {
	spec := podvol.VolumeSpec{PVName: pv.Name, Mode: podvol.Filesystem, MountOptions: pv.Spec.MountOptions, GID: pv.Annotations[volumeGIDAnnotation]}
	if r := pv.Spec.ClaimRef; r != nil {
		spec.Claim = r.Namespace + "/" + r.Name
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == v1.PersistentVolumeBlock {
		spec.Mode = podvol.Block
	}
	if len(pv.Spec.AccessModes) > 0 {
		spec.AccessMode = string(pv.Spec.AccessModes[0])
		spec.AccessModes = slices.Clone(pv.Spec.AccessModes)
		spec.ReadWriteOnce = slices.Contains(pv.Spec.AccessModes, v1.ReadWriteOnce)
	}
	return spec
}

// inTreeMountOptions are the mount options of a PV of another plugin than
// CSI (local, nfs), as the kubelet's in-tree plugins read them
// (MountOptionFromSpec): the beta annotation
// volume.beta.kubernetes.io/mount-options, split at commas, when the PV
// has it, else spec.mountOptions. Empty options are dropped, as the
// kubelet joins them. The CSI plugin reads only spec.mountOptions.
func inTreeMountOptions(pv *v1.PersistentVolume) []string {
	mo, ok := pv.Annotations[v1.MountOptionAnnotation]
	if !ok {
		return pv.Spec.MountOptions
	}
	var out []string
	for _, o := range strings.Split(mo, ",") {
		if o != "" {
			out = append(out, o)
		}
	}
	return out
}

// volumeGIDAnnotation names a group that pods using the PV get as a
// supplemental group (GetExtraSupplementalGroupsForPod).
const volumeGIDAnnotation = "pv.beta.kubernetes.io/gid"

// inlineVolumeName is the unique name of a pod's inline CSI volume, the
// kubelet's: {plugin}/{podUID}-{specName}.
func inlineVolumeName(uid types.UID, specName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", podvol.CSIPluginName, uid, specName))
}

// inlineSpec is the spec of an inline (ephemeral) CSI volume: pod-scoped,
// with the kubelet's handle, csi- + sha256(podUID + specName).
func inlineSpec(pod *v1.Pod, v *v1.Volume) podvol.VolumeSpec {
	sum := sha256.Sum256([]byte(string(pod.UID) + v.Name))
	spec := podvol.VolumeSpec{
		Name:         inlineVolumeName(pod.UID, v.Name),
		Driver:       v.CSI.Driver,
		VolumeHandle: "csi-" + hex.EncodeToString(sum[:]),
		Mode:         podvol.Filesystem,
		Attributes:   v.CSI.VolumeAttributes,
		Ephemeral:    true,
		// The kubelet publishes inline volumes as ReadWriteOnce.
		AccessMode: string(v1.ReadWriteOnce),
	}
	if v.CSI.FSType != nil {
		spec.FSType = *v.CSI.FSType
	}
	if v.CSI.ReadOnly != nil {
		spec.ReadOnly = *v.CSI.ReadOnly
	}
	if r := v.CSI.NodePublishSecretRef; r != nil {
		spec.NodePublishSecret = &podvol.SecretRef{Namespace: pod.Namespace, Name: r.Name}
	}
	return spec
}

// ExpansionClaim returns the PV of spec and the claim bound to it, read
// through the listers, for the planner to decide the volume's node
// expansion on (planner.ExpansionFacts); nil, nil when either is missing,
// the claim is bound to another volume, or the volume's plugin does not
// grow volumes on the node (volume.Expander: the kubelet's
// FindNodeExpandablePluginBySpec; a migrated in-tree PV is the CSI
// plugin's).
func (r *Resolver) ExpansionClaim(spec *podvol.VolumeSpec) (*v1.PersistentVolume, *v1.PersistentVolumeClaim) {
	if p, err := r.Plugins.ForVolume(spec.Name); err != nil || !isExpander(p) {
		return nil, nil
	}
	pv, err := r.PVs.Get(spec.PVName)
	if err != nil || pv.Spec.ClaimRef == nil {
		return nil, nil
	}
	pvc, err := r.PVCs.PersistentVolumeClaims(pv.Spec.ClaimRef.Namespace).Get(pv.Spec.ClaimRef.Name)
	if err != nil || pvc.Spec.VolumeName != pv.Name {
		return nil, nil
	}
	return pv, pvc
}

// isExpander reports whether p grows its volumes on the node.
func isExpander(p volume.Plugin) bool {
	_, ok := p.(volume.Expander)
	return ok
}
