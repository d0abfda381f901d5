package resolve

import (
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	k8scache "k8s.io/client-go/tools/cache"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// testPlugins are the plugins New registers by default: CSI and image.
var testPlugins = func() *volume.Registry {
	defaults, err := defaultPlugins(pluginsConfig{RootDir: os.TempDir(), Mounter: mount.NewFakeMounter(nil)}, func() (*v1.Node, error) { return nil, errNoNode }, objectcache.New(objectcache.Config{Client: fake.NewClientset()}), tokens.New(fake.NewClientset(), nil), nil)
	if err != nil {
		panic(err)
	}
	r, err := volume.NewRegistry(append([]volume.Plugin{newCSIPlugin(os.TempDir())}, defaults...)...)
	if err != nil {
		panic(err)
	}
	return r
}()

// selected is PodVolumes with testPlugins: the volumes selected and
// which of them are used as block devices.
func selected(pod *v1.Pod) (vols []v1.Volume, block map[string]bool) {
	pvs := PodVolumes(pod, testPlugins)
	block = map[string]bool{}
	for _, v := range pvs {
		vols = append(vols, v.Volume)
		block[v.Name] = v.block
	}
	return vols, block
}

// testResolver returns a Resolver over listers holding objs (PVCs, PVs).
func testResolver(t *testing.T, objs ...any) *Resolver {
	t.Helper()
	pvcs := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{k8scache.NamespaceIndex: k8scache.MetaNamespaceIndexFunc})
	pvs := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})
	for _, o := range objs {
		idx := pvs
		if _, ok := o.(*v1.PersistentVolumeClaim); ok {
			idx = pvcs
		}
		if err := idx.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	return &Resolver{Plugins: testPlugins, PVCs: corelisters.NewPersistentVolumeClaimLister(pvcs), PVs: corelisters.NewPersistentVolumeLister(pvs)}
}

func boundClaim(ns, name, pv string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pv},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
}

func csiPV(name, driver, handle string, claim *v1.PersistentVolumeClaim) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			ClaimRef:               &v1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
		},
	}
}

func podWithVolumes(uid, ns string, vols ...v1.Volume) *v1.Pod {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: ns, Name: "pod-" + uid}}
	pod.Spec.Volumes = vols
	c := v1.Container{Name: "c"}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	pod.Spec.Containers = []v1.Container{c}
	return pod
}

func claimVolume(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// TestResolveRefusesInvalidDriverNames: a driver name that is not a CSI
// driver name is an error for a PV and for an inline volume (found by
// FuzzResolvePod). Before, PV a (driver d.example.com^x, handle h) and
// PV b (driver d.example.com, handle x^h) both got the unique name
// kubernetes.io/csi/d.example.com^x^h, and the desired state gave the
// pods of one the spec of the other.
func TestResolveRefusesInvalidDriverNames(t *testing.T) {
	claimA, claimB := boundClaim("ns", "claim-a", "pv-a"), boundClaim("ns", "claim-b", "pv-b")
	r := testResolver(t, claimA, claimB,
		csiPV("pv-a", "d.example.com^x", "h", claimA), csiPV("pv-b", "d.example.com", "x^h", claimB))

	_, _, resolved, errs := r.ResolvePod(podWithVolumes("uid-a", "ns", claimVolume("vol", "claim-a")))
	if len(resolved) != 0 || errs["vol"] == nil || !strings.Contains(errs["vol"].Error(), "PV pv-a") {
		t.Errorf("PV with driver d.example.com^x: resolved %+v, errors %v; want an error naming the PV", resolved, errs)
	}
	_, _, resolved, errs = r.ResolvePod(podWithVolumes("uid-b", "ns", claimVolume("vol", "claim-b")))
	if len(errs) != 0 || len(resolved) != 1 || resolved[0].Spec.Name != podvol.CSIVolumeName("d.example.com", "x^h") {
		t.Errorf("PV with driver d.example.com: resolved %+v, errors %v", resolved, errs)
	}

	for _, driver := range []string{"", "a^b", "../x", "\u212a.example.com", strings.Repeat("a", 64)} {
		inline := v1.Volume{Name: "inline", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: driver}}}
		_, _, resolved, errs := r.ResolvePod(podWithVolumes("uid-c", "ns", inline))
		if len(resolved) != 0 || errs["inline"] == nil || !strings.Contains(errs["inline"].Error(), `volume "inline": inline CSI volume`) {
			t.Errorf("inline volume with driver %q: resolved %+v, errors %v; want an error", driver, resolved, errs)
		}
	}
}

// TestResolveRefusesSlashInClaimNames: the lister's key is namespace/name,
// so pod namespace a with claim b/c would find claim c of namespace a/b
// (found by FuzzResolvePod). Such names are refused.
func TestResolveRefusesSlashInClaimNames(t *testing.T) {
	other := boundClaim("a/b", "c", "pv")
	r := testResolver(t, other, csiPV("pv", "csi.example.com", "h", other))
	for _, tc := range []struct{ ns, claim string }{{"a", "b/c"}, {"a/b", "c"}} {
		_, _, resolved, errs := r.ResolvePod(podWithVolumes("uid-1", tc.ns, claimVolume("vol", tc.claim)))
		if len(resolved) != 0 || errs["vol"] == nil || !strings.Contains(errs["vol"].Error(), "invalid namespace or claim name") {
			t.Errorf("namespace %q claim %q: resolved %+v, errors %v; want an error", tc.ns, tc.claim, resolved, errs)
		}
	}
}

// TestPVSpecAccessModes: the CSI capability gets the PV's first access
// mode (as the kubelet's), and fsGroup's ReadWriteOnceWithFSType policy
// sees ReadWriteOnce wherever the PV lists it.
func TestPVSpecAccessModes(t *testing.T) {
	for _, tt := range []struct {
		modes     []v1.PersistentVolumeAccessMode
		wantFirst string
		wantRWO   bool
	}{
		{modes: nil},
		{modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, wantFirst: "ReadWriteOnce", wantRWO: true},
		{modes: []v1.PersistentVolumeAccessMode{v1.ReadOnlyMany, v1.ReadWriteOnce}, wantFirst: "ReadOnlyMany", wantRWO: true},
		{modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany, v1.ReadOnlyMany}, wantFirst: "ReadWriteMany"},
		{modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}, wantFirst: "ReadWriteOncePod"},
	} {
		pv := csitest.PV("pv", csitest.PVSpec{Driver: "csi.example.com", Handle: "h1"})
		pv.Spec.AccessModes = tt.modes
		spec, err := PVSpec(pv)
		if err != nil {
			t.Fatal(err)
		}
		if spec.AccessMode != tt.wantFirst || spec.ReadWriteOnce != tt.wantRWO {
			t.Errorf("modes %v: AccessMode %q, ReadWriteOnce %v; want %q, %v", tt.modes, spec.AccessMode, spec.ReadWriteOnce, tt.wantFirst, tt.wantRWO)
		}
	}
}

// newCSIPlugin is the CSI plugin as New builds it on root, with empty
// listers: what CanSupport and Reconstruct answer needs nothing more.
func newCSIPlugin(root string) volume.Plugin {
	p, err := csiplugin.New(csiplugin.Config{
		RootDir: root, NodeName: node,
		CSIDriverLister:        storagelisters.NewCSIDriverLister(k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})),
		VolumeAttachmentLister: storagelisters.NewVolumeAttachmentLister(k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})),
	})
	if err != nil {
		panic(err)
	}
	return p
}
