package volume

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReplacedKinds: a pod volume or a PV of a kind nodevol leaves out
// (iscsi, fc) is still refused, wrapping ErrNoPlugin, and the error names
// what replaces the kind; other kinds nobody handles get no hint.
func TestReplacedKinds(t *testing.T) {
	r, err := NewRegistry(fakePlugin{"example.com/empty", emptyDirs})
	if err != nil {
		t.Fatal(err)
	}
	const (
		iscsi = `; nodevol does not mount iscsi volumes in-tree: use the CSI driver "iscsi.csi.k8s.io" (kubernetes-csi/csi-driver-iscsi)`
		fc    = "; nodevol does not mount fc (Fibre Channel) volumes in-tree: use your storage vendor's CSI driver (kubernetes-csi has no Fibre Channel driver)"
	)
	for _, tt := range []struct {
		src  v1.VolumeSource
		want string
	}{
		{v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t", Lun: 0}},
			`volume "san" of kind iscsi: no volume plugin handles it (registered: example.com/empty)` + iscsi},
		{v1.VolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0981891b8dc5"}}},
			`volume "san" of kind fc: no volume plugin handles it (registered: example.com/empty)` + fc},
		{v1.VolumeSource{Cinder: &v1.CinderVolumeSource{VolumeID: "v"}},
			`volume "san" of kind cinder: no volume plugin handles it (registered: example.com/empty)`},
	} {
		p, err := r.ForSource(&v1.Volume{Name: "san", VolumeSource: tt.src})
		if p != nil || err == nil || err.Error() != tt.want || !errors.Is(err, ErrNoPlugin) {
			t.Errorf("ForSource = %v, %v; want %q wrapping ErrNoPlugin", p, err, tt.want)
		}
	}
	for _, tt := range []struct {
		src  v1.PersistentVolumeSource
		want string
	}{
		{v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}},
			`PV pv-1 of kind iscsi: no volume plugin handles it (registered: none)` + iscsi},
		{v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"3600508b400105e210000900000490000"}}},
			`PV pv-1 of kind fc: no volume plugin handles it (registered: none)` + fc},
		{v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}},
			`PV pv-1 of kind nfs: no volume plugin handles it (registered: none)`},
	} {
		pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: tt.src}}
		p, err := (&Registry{plugins: map[string]Plugin{}}).ForPV(pv)
		if p != nil || err == nil || err.Error() != tt.want || !errors.Is(err, ErrNoPlugin) {
			t.Errorf("ForPV = %v, %v; want %q wrapping ErrNoPlugin", p, err, tt.want)
		}
	}
	if replacedBy("nfs") != "" || replacedBy("emptyDir") != "" {
		t.Error("ReplacedBy names a replacement for a kind nodevol handles")
	}
}
