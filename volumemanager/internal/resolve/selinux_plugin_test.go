package resolve

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8scache "k8s.io/client-go/tools/cache"

	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// fcLikePlugin is an embedder's plugin of PVs with a Fibre Channel source
// that mounts with an SELinux context when seLinuxMount says so, as the
// kubelet's fc and iscsi plugins do.
type fcLikePlugin struct{ seLinuxMount bool }

func (fcLikePlugin) Name() string                              { return "example.com/fc" }
func (fcLikePlugin) CanSupport(v *v1.Volume) bool              { return v.PersistentVolumeClaim != nil }
func (fcLikePlugin) CanSupportPV(pv *v1.PersistentVolume) bool { return pv.Spec.FC != nil }
func (p fcLikePlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{SELinuxMount: p.seLinuxMount}, nil
}
func (fcLikePlugin) SetUp(context.Context, volume.MountRequest) (string, error) { return "", nil }
func (fcLikePlugin) TearDown(context.Context, volume.MountRequest) error        { return nil }

// TestSELinuxOtherPlugins: a PV of a plugin other than CSI gets its pod's
// context when the plugin's Capabilities.SELinuxMount says it mounts with
// one, and none otherwise; containers that disagree on such a PV are an
// error either way, as in the kubelet 1.37 (the check comes before the
// plugin's).
func TestSELinuxOtherPlugins(t *testing.T) {
	for _, tc := range []struct {
		name     string
		support  bool
		disagree bool
		want     string
		err      string
	}{
		{name: "plugin mounts with a context", support: true, want: contextA},
		{name: "plugin without context mounts", support: false},
		{name: "containers disagree, plugin without context mounts", disagree: true,
			err: "the containers that mount it have different SELinux labels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pvcs := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{k8scache.NamespaceIndex: k8scache.MetaNamespaceIndexFunc})
			pvs := k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})
			pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-fc"}, Spec: v1.PersistentVolumeSpec{
				AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
				ClaimRef:               &v1.ObjectReference{Namespace: "ns", Name: "a", UID: "pvc-a"},
				PersistentVolumeSource: v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"w"}}},
			}}
			pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "pvc-a"},
				Spec: v1.PersistentVolumeClaimSpec{VolumeName: pv.Name}, Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound}}
			if err := pvs.Add(pv); err != nil {
				t.Fatal(err)
			}
			if err := pvcs.Add(pvc); err != nil {
				t.Fatal(err)
			}
			plugins, err := volume.NewRegistry(fcLikePlugin{seLinuxMount: tc.support})
			if err != nil {
				t.Fatal(err)
			}
			r := &Resolver{Plugins: plugins, PVCs: corelisters.NewPersistentVolumeClaimLister(pvcs), PVs: corelisters.NewPersistentVolumeLister(pvs), SELinuxEnabled: true}
			pod := seLinuxPod("p", "a", levelA)
			pod.UID = types.UID("uid-p")
			if tc.disagree {
				c := *pod.Spec.Containers[0].DeepCopy()
				c.Name += "-2"
				c.SecurityContext = &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelB}}
				pod.Spec.Containers = append(pod.Spec.Containers, c)
			}
			_, _, resolved, errs := r.ResolvePod(pod)
			if tc.err != "" {
				if err := errs["data"]; err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if len(errs) > 0 || len(resolved) != 1 {
				t.Fatalf("resolved %+v, errors %v", resolved, errs)
			}
			if got := resolved[0].Volume.SELinuxLabel; got != tc.want {
				t.Errorf("context %q, want %q", got, tc.want)
			}
		})
	}
}
