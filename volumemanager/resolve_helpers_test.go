package volumemanager

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"runtime"
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
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// Helpers of the facade's tests that resolve pods, as internal/resolve's
// tests have them.

// testPlugins are the plugins New registers by default: CSI and image.
var testPlugins = func() *volume.Registry {
	defaults, err := defaultPlugins(Config{RootDir: os.TempDir(), Mounter: mount.NewFakeMounter(nil)}, func() (*v1.Node, error) { return nil, errors.New("this node's Node object is not known yet") }, objectcache.New(objectcache.Config{Client: fake.NewClientset()}), tokens.New(fake.NewClientset(), nil), nil)
	if err != nil {
		panic(err)
	}
	r, err := volume.NewRegistry(append([]volume.Plugin{newCSIPlugin(os.TempDir())}, defaults...)...)
	if err != nil {
		panic(err)
	}
	return r
}()

// testResolver returns a Resolver over listers holding objs (PVCs, PVs).
func testResolver(t *testing.T, objs ...any) *resolve.Resolver {
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
	return &resolve.Resolver{Plugins: testPlugins, PVCs: corelisters.NewPersistentVolumeClaimLister(pvcs), PVs: corelisters.NewPersistentVolumeLister(pvs)}
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

// trimPod is the pod the loop resolves for pod.
// keptOf is Keep with the default plugins.
func keptOf(pod *v1.Pod) *resolve.KeptPod {
	return resolve.Keep(pod, testPlugins)
}

// liveBytes returns the bytes of live heap objects after a collection.
// measuringProcess runs the calling test again alone, in a process of
// its own (the test binary, with an environment variable that tells it),
// and reports whether this is that process: a test that measures the live
// heap measures there, where no goroutine left by an earlier test is
// allocating or freeing meanwhile.
func measuringProcess(t *testing.T) bool {
	t.Helper()
	const childEnv = "NODEVOL_MEASURING_PROCESS"
	if os.Getenv(childEnv) != "" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("the measuring process:\n%s", out)
	if err != nil {
		t.Fatalf("the measuring process failed: %v", err)
	}
	return false
}

func liveBytes() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// sameMap reports whether a and b are one map (not only equal ones).
func sameMap(a, b v1.ResourceList) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}
