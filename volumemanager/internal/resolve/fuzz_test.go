package resolve

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8scache "k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// fuzzInput hands out the choices a fuzzed pod and its objects are built
// from: bytes from shape (zero once used up) and strings from a small pool
// (so that names often repeat: a claim the pod names exists, a PV the
// claim names exists, a claim's UID matches the PV's claimRef).
type fuzzInput struct {
	shape []byte
	pool  []string
}

func (in *fuzzInput) byte() byte {
	if len(in.shape) == 0 {
		return 0
	}
	b := in.shape[0]
	in.shape = in.shape[1:]
	return b
}

func (in *fuzzInput) bit(b byte, n uint) bool { return b&(1<<n) != 0 }

func (in *fuzzInput) str() string { return in.pool[int(in.byte())%len(in.pool)] }

// fuzzPod builds a pod and the PVCs and PVs around it from the input.
func fuzzPod(in *fuzzInput, uid, ns, name string) (*v1.Pod, []*v1.PersistentVolumeClaim, []*v1.PersistentVolume) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: ns, Name: name}}
	pod.Spec.Containers = []v1.Container{{Name: "c"}}
	pod.Spec.InitContainers = []v1.Container{{Name: "i"}}
	pod.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "e"}}}
	c, ic, ec := &pod.Spec.Containers[0], &pod.Spec.InitContainers[0], &pod.Spec.EphemeralContainers[0]
	if b := in.byte(); b != 0 {
		sc := &v1.PodSecurityContext{}
		if in.bit(b, 0) {
			g := int64(b)
			sc.FSGroup = &g
		}
		if in.bit(b, 1) {
			p := v1.FSGroupChangeOnRootMismatch
			sc.FSGroupChangePolicy = &p
		}
		if in.bit(b, 2) {
			sc.SELinuxOptions = &v1.SELinuxOptions{Level: in.str()}
		}
		pod.Spec.SecurityContext = sc
	}
	for n := in.byte() % 6; n > 0; n-- {
		v := v1.Volume{Name: in.str()}
		kind, use := in.byte(), in.byte()
		switch kind % 5 {
		case 0:
			v.PersistentVolumeClaim = &v1.PersistentVolumeClaimVolumeSource{ClaimName: in.str(), ReadOnly: in.bit(kind, 3)}
		case 1:
			v.Ephemeral = &v1.EphemeralVolumeSource{}
		case 2:
			src := &v1.CSIVolumeSource{Driver: in.str()}
			if in.bit(kind, 3) {
				src.VolumeAttributes = map[string]string{in.str(): in.str()}
			}
			if in.bit(kind, 4) {
				ro := in.bit(kind, 5)
				src.ReadOnly = &ro
			}
			if in.bit(kind, 6) {
				fs := in.str()
				src.FSType = &fs
			}
			if in.bit(kind, 7) {
				src.NodePublishSecretRef = &v1.LocalObjectReference{Name: in.str()}
			}
			v.CSI = src
		case 3:
			v.EmptyDir = &v1.EmptyDirVolumeSource{}
		case 4: // two sources at once, which the API refuses
			v.PersistentVolumeClaim = &v1.PersistentVolumeClaimVolumeSource{ClaimName: in.str()}
			v.CSI = &v1.CSIVolumeSource{Driver: in.str()}
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		// Used (or not) by the app, init and ephemeral containers, as a
		// mount or a device; a mention may name another volume.
		ref := v.Name
		if in.bit(use, 7) {
			ref = in.str()
		}
		if in.bit(use, 0) {
			c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: ref})
		}
		if in.bit(use, 1) {
			c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: ref})
		}
		if in.bit(use, 2) {
			ic.VolumeMounts = append(ic.VolumeMounts, v1.VolumeMount{Name: ref})
		}
		if in.bit(use, 3) {
			ic.VolumeDevices = append(ic.VolumeDevices, v1.VolumeDevice{Name: ref})
		}
		if in.bit(use, 4) {
			ec.VolumeMounts = append(ec.VolumeMounts, v1.VolumeMount{Name: ref})
		}
	}

	var pvcs []*v1.PersistentVolumeClaim
	for n := in.byte() % 5; n > 0; n-- {
		b := in.byte()
		pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: in.str(), UID: types.UID(in.str())}}
		if in.bit(b, 0) {
			pvc.Namespace = in.str()
		}
		if in.bit(b, 1) && len(pod.Spec.Volumes) > 0 { // the claim of a generic ephemeral volume
			pvc.Name = name + "-" + pod.Spec.Volumes[int(in.byte())%len(pod.Spec.Volumes)].Name
		}
		if in.bit(b, 2) {
			ctrl := in.bit(b, 3)
			pvc.OwnerReferences = []metav1.OwnerReference{{UID: types.UID(in.str()), Controller: &ctrl}}
			if in.bit(b, 4) {
				pvc.OwnerReferences[0].UID = pod.UID
			}
		}
		if in.bit(b, 5) {
			pvc.DeletionTimestamp = &metav1.Time{}
		}
		if !in.bit(b, 6) {
			pvc.Status.Phase = v1.ClaimBound
			pvc.Spec.VolumeName = in.str()
		}
		pvcs = append(pvcs, pvc)
	}

	var pvs []*v1.PersistentVolume
	for n := in.byte() % 5; n > 0; n-- {
		b := in.byte()
		pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: in.str()}}
		if in.bit(b, 0) && len(pvcs) > 0 { // the PV of one of the claims
			pvc := pvcs[int(in.byte())%len(pvcs)]
			pv.Name = pvc.Spec.VolumeName
			pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID}
		} else if in.bit(b, 1) {
			pv.Spec.ClaimRef = &v1.ObjectReference{UID: types.UID(in.str())}
		}
		if !in.bit(b, 2) {
			pv.Spec.CSI = &v1.CSIPersistentVolumeSource{Driver: in.str(), VolumeHandle: in.str(), FSType: in.str(),
				ReadOnly: in.bit(b, 3), VolumeAttributes: map[string]string{in.str(): in.str()}}
			if in.bit(b, 4) {
				pv.Spec.CSI.NodeStageSecretRef = &v1.SecretReference{Namespace: in.str(), Name: in.str()}
			}
		}
		if in.bit(b, 5) {
			mode := v1.PersistentVolumeFilesystem
			if in.bit(b, 6) {
				mode = v1.PersistentVolumeBlock
			}
			pv.Spec.VolumeMode = &mode
		}
		if in.bit(b, 7) {
			pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
			pv.Annotations = map[string]string{volumeGIDAnnotation: in.str()}
		}
		pvs = append(pvs, pv)
	}
	return pod, pvcs, pvs
}

// findPVC and findPV look an object up by its own namespace and name, not
// by the lister's key.
func findPVC(pvcs []any, ns, name string) *v1.PersistentVolumeClaim {
	for _, o := range pvcs {
		if c := o.(*v1.PersistentVolumeClaim); c.Namespace == ns && c.Name == name {
			return c
		}
	}
	return nil
}

func findPV(pvs []any, name string) *v1.PersistentVolume {
	for _, o := range pvs {
		if pv := o.(*v1.PersistentVolume); pv.Name == name {
			return pv
		}
	}
	return nil
}

// FuzzResolvePod feeds PodVolumes and Resolver.resolvePod a pod built
// from fuzzed names and choices (volume names, claims, generic ephemeral
// and inline CSI volumes with their driver and attributes, mounts and
// devices in app, init and ephemeral containers, pod UID, namespace and
// name) against listers over client-go indexers holding a few fuzzed PVCs
// and PVs. It checks that it never panics and that:
//   - PodVolumes returns, in spec order, exactly the volumes with a PVC,
//     ephemeral or CSI source that a container mounts or maps, marked block
//     exactly when one maps it;
//   - wanted is those volumes' names; every one is resolved or has an
//     error, and nothing else is;
//   - every error names the pod (namespace/name) and the volume (quoted);
//   - every resolved volume's unique name is well-formed: for a PV,
//     kubernetes.io/csi/{driver}^{handle} with a valid CSI driver name
//     (so no "^" in it) and a non-empty handle, reached through the claim
//     of that name in the pod's namespace, owned by the pod for a generic
//     ephemeral volume, bound both ways to a CSI PV of that name; for an
//     inline volume, kubernetes.io/csi/{podUID}-{volume} with a valid
//     driver name and the kubelet's handle;
//   - a volume used as a device is resolved only with a Block PV, one only
//     mounted only with a Filesystem PV (a device with a Filesystem PV, or
//     an inline volume as a device, is an error);
//   - each resolved volume carries the pod and its read-only flag.
func FuzzResolvePod(f *testing.F) {
	// shape: security context; volume count, then per volume name, kind,
	// use, and the kind's choices; PVC count and choices; PV count and
	// choices. pool is split on "|".
	const pvPool = "vol|claim|pv-1|csi.example.com|handle-1|claim-uid"
	// One volume (name, kind PVC, use) and its claim; one bound PVC; one
	// PV bound to it (mode byte), with driver and handle.
	pvcShape := func(use, pvMode byte) []byte {
		return []byte{0, 1, 0, 0, use, 1, 1, 0, 1, 5, 2, 1, pvMode, 0, 0, 3, 4, 0, 0, 0}
	}
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x01, 0x01))         // mounted, Filesystem PV: resolved
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x02, 0x01))         // as a device, Filesystem PV: error
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x03, 0x01))         // both, Filesystem PV: error
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x02, 0x61))         // as a device, Block PV: resolved
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x01, 0x61))         // mounted, Block PV: error
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x18, 0x61))         // init container device + ephemeral container mount
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x00, 0x01))         // not used by any container: ignored
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x81, 0x01))         // mounted under another name: ignored
	f.Add("uid-1", "ns", "pod", pvPool, pvcShape(0x01, 0x05))         // PV without a CSI source
	f.Add("uid-1", "ns", "pod", "vol|claim|pv|d.example.com^x|h|uid", // a driver name holding the unique name's separator
		pvcShape(0x01, 0x01))
	f.Add("uid-1", "ns", "pod", "vol|claim|pv||h|uid", pvcShape(0x01, 0x01))                        // empty driver
	f.Add("uid-1", "ns", "pod", "vol|claim|pv|d|h|uid", []byte{0, 1, 0, 0, 1, 1, 1, 0x40, 1, 5})    // claim not bound
	f.Add("uid-1", "ns", "pod", "vol|claim|pv|d|h|uid", []byte{0, 1, 0, 0, 1, 1, 1, 0x20, 1, 5, 2}) // claim being deleted
	f.Add("uid-1", "ns", "pod", "vol|claim|pv|d|h|uid", []byte{0, 1, 0, 0, 1, 1, 1, 0, 1, 5, 2})    // PV missing
	f.Add("uid-1", "ns", "pod", "vol|claim|pv|d|h|uid",                                             // PV bound to another claim
		[]byte{0, 1, 0, 0, 1, 1, 1, 0, 1, 5, 2, 1, 0x02, 2, 0, 3, 4, 0, 0, 0})
	// Inline CSI volumes: with attributes, read-only, fsType and secret,
	// mounted; as a device; without a driver.
	f.Add("uid-1", "ns", "pod", "inline|csi.example.com|key|value", []byte{7, 3, 1, 0, 0xfc, 1, 1, 2, 3, 3, 0, 0, 0})
	f.Add("uid-1", "ns", "pod", "inline|csi.example.com", []byte{0, 1, 0, 2, 2, 1, 0, 0})
	f.Add("uid-1", "ns", "pod", "inline|", []byte{0, 1, 0, 2, 1, 1, 0, 0})
	f.Add("uid-1", "ns", "pod", "inline|a^b", []byte{0, 1, 0, 2, 1, 1, 0, 0})
	// Generic ephemeral volumes: the claim pod-eph, owned by the pod; not
	// owned; owned but not as controller.
	ephShape := func(owner byte) []byte {
		return []byte{0, 1, 0, 1, 1, 1, owner, 0, 4, 0, 0, 1, 1, 1, 0, 0, 2, 3, 0, 0, 0}
	}
	const ephPool = "eph|pv|csi.example.com|h|uid-c"
	f.Add("uid-1", "ns", "pod", ephPool, ephShape(0x1e))
	f.Add("uid-1", "ns", "pod", ephPool, ephShape(0x0e))
	f.Add("uid-1", "ns", "pod", ephPool, ephShape(0x16))
	// A claim name with a slash: pod namespace "a" and claim "b/c" make
	// the lister key a/b/c, that of claim "c" in namespace "a/b".
	f.Add("uid-1", "a", "pod", "vol|b/c|a/b|c|pv|csi.example.com|h|uid",
		[]byte{0, 1, 0, 0, 1, 1, 1, 1, 3, 7, 2, 4, 1, 1, 0, 0, 5, 6, 0, 0, 0})
	// Two volumes of one name, one PVC and one inline; every kind at once.
	f.Add("uid-1", "ns", "pod", pvPool, []byte{0, 2, 0, 0, 1, 1, 0, 2, 1, 3, 1, 0, 1, 5, 2, 1, 1, 0, 0, 3, 4, 0, 0, 0})
	f.Add("uid-1", "ns", "pod", "a|a|a", []byte{0xff, 5, 0, 0, 0xff, 0, 1, 0xff, 0, 2, 0xff, 0, 3, 0xff, 0, 4, 0xff, 4, 0xff, 0xff, 0xff, 4, 0xff, 0xff, 0xff})
	f.Add("", "", "", "", []byte{})
	f.Add(strings.Repeat("u", 4096), "ns\x00", "../pod", "..|/|\x00|"+strings.Repeat("x", 4096), []byte{0, 5, 0, 0, 1, 1, 1, 2, 1, 2, 2, 1, 3, 0, 1, 4, 1, 1, 1})
	f.Fuzz(func(t *testing.T, uid, ns, name, pool string, shape []byte) {
		in := &fuzzInput{shape: shape, pool: strings.Split(pool, "|")}
		pod, pvcs, pvs := fuzzPod(in, uid, ns, name)
		pvcIndex := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{k8scache.NamespaceIndex: k8scache.MetaNamespaceIndexFunc})
		pvIndex := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})
		for _, o := range pvcs {
			if err := pvcIndex.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range pvs {
			if err := pvIndex.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		r := &Resolver{Plugins: testPlugins, PVCs: corelisters.NewPersistentVolumeClaimLister(pvcIndex), PVs: corelisters.NewPersistentVolumeLister(pvIndex)}
		before := pod.DeepCopy()

		// PodVolumes against the definition.
		mounts, devices := map[string]bool{}, map[string]bool{}
		for _, c := range append(slices.Clone(pod.Spec.Containers), pod.Spec.InitContainers...) {
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = true
			}
			for _, d := range c.VolumeDevices {
				devices[d.Name] = true
			}
		}
		for _, c := range pod.Spec.EphemeralContainers {
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = true
			}
		}
		var wantVols []string
		for _, v := range pod.Spec.Volumes {
			if (mounts[v.Name] || devices[v.Name]) && (v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil) {
				wantVols = append(wantVols, v.Name)
			}
		}
		vols, block := selected(pod)
		var gotVols []string
		for _, v := range vols {
			gotVols = append(gotVols, v.Name)
			if block[v.Name] != devices[v.Name] {
				t.Fatalf("podVolumes: volume %q block = %v, but used as a device: %v", v.Name, block[v.Name], devices[v.Name])
			}
		}
		if !slices.Equal(gotVols, wantVols) {
			t.Fatalf("podVolumes = %q, want %q", gotVols, wantVols)
		}

		ref, wanted, resolved, errs := r.ResolvePod(pod)
		if want := (podvol.PodRef{UID: pod.UID, Namespace: ns, Name: name}); ref != want {
			t.Fatalf("ref = %+v, want %+v", ref, want)
		}
		if !slices.Equal(wanted, wantVols) {
			t.Fatalf("wanted = %q, want %q", wanted, wantVols)
		}
		for vol, err := range errs {
			if !slices.Contains(wanted, vol) {
				t.Fatalf("error for volume %q, which is not wanted: %v", vol, err)
			}
			if msg := err.Error(); !strings.Contains(msg, ref.String()) || !strings.Contains(msg, fmt.Sprintf("%q", vol)) {
				t.Fatalf("error %q does not name pod %s and volume %q", msg, ref, vol)
			}
		}
		done := map[string]bool{}
		for _, dv := range resolved {
			done[dv.Volume.SpecName] = true
		}
		for _, vol := range wanted {
			if !done[vol] && errs[vol] == nil {
				t.Fatalf("volume %q neither resolved nor failed", vol)
			}
		}

		pvcObjs, pvObjs := pvcIndex.List(), pvIndex.List()
		for _, dv := range resolved {
			if !slices.Contains(wanted, dv.Volume.SpecName) {
				t.Fatalf("resolved %+v for a volume the pod does not want", dv)
			}
			if dv.Volume.Pod != ref {
				t.Fatalf("resolved volume %q carries pod %+v, want %+v", dv.Volume.SpecName, dv.Volume.Pod, ref)
			}
			if err := csi.ValidateDriverName(dv.Spec.Driver); err != nil {
				t.Fatalf("resolved volume %q (%s) with an invalid driver name: %v", dv.Volume.SpecName, dv.Spec.Name, err)
			}
			if devices[dv.Volume.SpecName] != (dv.Spec.Mode == podvol.Block) {
				t.Fatalf("volume %q (used as a device: %v) resolved with volumeMode %s", dv.Volume.SpecName, devices[dv.Volume.SpecName], dv.Spec.Mode)
			}
			// The API refuses two volumes of one name; the Resolver
			// still must resolve each consistently with its source.
			var first error
			for i := range pod.Spec.Volumes {
				if v := &pod.Spec.Volumes[i]; v.Name == dv.Volume.SpecName {
					err := checkResolved(pod, v, dv, pvcObjs, pvObjs)
					if err == nil {
						first = nil
						break
					}
					if first == nil {
						first = err
					}
				}
			}
			if first != nil {
				t.Fatal(first)
			}
		}
		if !reflect.DeepEqual(before, pod) {
			t.Fatalf("resolvePod changed the pod")
		}
	})
}

// checkResolved checks a resolved volume against the pod volume v it may
// come from and the objects in the listers.
func checkResolved(pod *v1.Pod, v *v1.Volume, dv state.DesiredVolume, pvcObjs, pvObjs []any) error {
	spec, pv := dv.Spec, dv.Volume
	if spec.Ephemeral {
		sum := sha256.Sum256([]byte(string(pod.UID) + pv.SpecName))
		if want := podvol.UniqueVolumeName(podvol.CSIPluginName + "/" + string(pod.UID) + "-" + pv.SpecName); v.CSI == nil || spec.Name != want ||
			spec.PVName != "" || spec.Driver != v.CSI.Driver || spec.VolumeHandle != "csi-"+hex.EncodeToString(sum[:]) {
			return fmt.Errorf("inline volume %q resolved as %+v, want unique name %s from %+v", pv.SpecName, spec, want, v.VolumeSource)
		}
		return nil
	}
	if v.CSI != nil {
		return fmt.Errorf("inline volume %q resolved as from a PV: %+v", pv.SpecName, spec)
	}
	// From a PV: the name parses back into driver and handle.
	rest, ok := strings.CutPrefix(string(spec.Name), podvol.CSIPluginName+"/")
	driver, handle, ok2 := strings.Cut(rest, "^")
	if !ok || !ok2 || driver != spec.Driver || handle != spec.VolumeHandle || handle == "" || spec.PVName == "" {
		return fmt.Errorf("volume %q resolved with unique name %q, which is not %s/{driver}^{handle} of %+v", pv.SpecName, spec.Name, podvol.CSIPluginName, spec)
	}
	claim := pod.Name + "-" + v.Name
	if v.PersistentVolumeClaim != nil {
		claim = v.PersistentVolumeClaim.ClaimName
	}
	pvc := findPVC(pvcObjs, pod.Namespace, claim)
	if pvc == nil {
		return fmt.Errorf("volume %q resolved to PV %s, but namespace %q has no claim %q", pv.SpecName, spec.PVName, pod.Namespace, claim)
	}
	if v.PersistentVolumeClaim == nil && !ownedBy(pvc, pod) {
		return fmt.Errorf("generic ephemeral volume %q resolved through claim %s/%s, not owned by the pod", pv.SpecName, pod.Namespace, claim)
	}
	if pvc.DeletionTimestamp != nil || pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName != spec.PVName {
		return fmt.Errorf("volume %q resolved to PV %s through claim %+v", pv.SpecName, spec.PVName, pvc)
	}
	obj := findPV(pvObjs, spec.PVName)
	if obj == nil || obj.Spec.CSI == nil || obj.Spec.ClaimRef == nil || obj.Spec.ClaimRef.UID != pvc.UID {
		return fmt.Errorf("volume %q resolved to PV %s, which is not a CSI PV bound to claim %s/%s: %+v", pv.SpecName, spec.PVName, pod.Namespace, claim, obj)
	}
	if spec.Driver != obj.Spec.CSI.Driver || spec.VolumeHandle != obj.Spec.CSI.VolumeHandle {
		return fmt.Errorf("volume %q: spec %+v does not match PV %+v", pv.SpecName, spec, obj.Spec.CSI)
	}
	if block := obj.Spec.VolumeMode != nil && *obj.Spec.VolumeMode == v1.PersistentVolumeBlock; block != (spec.Mode == podvol.Block) {
		return fmt.Errorf("volume %q resolved with mode %s from PV %s with volumeMode %v", pv.SpecName, spec.Mode, obj.Name, obj.Spec.VolumeMode)
	}
	wantRO := obj.Spec.CSI.ReadOnly || v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly
	if pv.ReadOnly != wantRO || spec.ReadOnly != obj.Spec.CSI.ReadOnly {
		return fmt.Errorf("volume %q: read-only %v (spec %v), want %v", pv.SpecName, pv.ReadOnly, spec.ReadOnly, wantRO)
	}
	return nil
}
