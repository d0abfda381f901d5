package volume

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pvPlugin is a fakePlugin that also claims the PVs pv says yes to.
type pvPlugin struct {
	fakePlugin
	pv func(*v1.PersistentVolume) bool
}

func (p pvPlugin) CanSupportPV(pv *v1.PersistentVolume) bool { return p.pv(pv) }

func localPVs(pv *v1.PersistentVolume) bool    { return pv.Spec.Local != nil }
func hostPathPVs(pv *v1.PersistentVolume) bool { return pv.Spec.HostPath != nil }

func TestForPV(t *testing.T) {
	never := func(*v1.Volume) bool { return false }
	local := pvPlugin{fakePlugin{"example.com/local", never}, localPVs}
	host := pvPlugin{fakePlugin{"example.com/host", hostPaths}, hostPathPVs}
	greedy := pvPlugin{fakePlugin{"example.com/greedy", never}, func(*v1.PersistentVolume) bool { return true }}
	pv := func(src v1.PersistentVolumeSource) *v1.PersistentVolume {
		return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: src}}
	}
	tests := []struct {
		name    string
		plugins []Plugin
		pv      *v1.PersistentVolume
		want    string // the plugin's name, or a part of the error
		noPlug  bool
	}{
		{"local", []Plugin{local, host, fakePlugin{"example.com/plain", emptyDirs}}, pv(v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/d"}}), "example.com/local", false},
		{"hostPath", []Plugin{local, host}, pv(v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/d"}}), "example.com/host", false},
		{"nobody", []Plugin{local, host}, pv(v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}), "PV pv-1 of kind nfs: no volume plugin", true},
		{"twice", []Plugin{local, greedy}, pv(v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/d"}}), "claimed by more than one volume plugin (example.com/greedy, example.com/local)", false},
		{"nil", []Plugin{local}, nil, "nil PV", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRegistry(tt.plugins...)
			if err != nil {
				t.Fatal(err)
			}
			p, err := r.ForPV(tt.pv)
			switch {
			case err == nil && p.Name() != tt.want:
				t.Errorf("ForPV = %s, want %s", p.Name(), tt.want)
			case err != nil && !strings.Contains(err.Error(), tt.want):
				t.Errorf("ForPV error %q, want it to contain %q", err, tt.want)
			case err != nil && errors.Is(err, ErrNoPlugin) != tt.noPlug:
				t.Errorf("ForPV error %q: errors.Is(ErrNoPlugin) = %v, want %v", err, !tt.noPlug, tt.noPlug)
			}
		})
	}
}

func TestPVSourceKind(t *testing.T) {
	for want, src := range map[string]v1.PersistentVolumeSource{
		"local":     {Local: &v1.LocalVolumeSource{}},
		"hostPath":  {HostPath: &v1.HostPathVolumeSource{}},
		"csi":       {CSI: &v1.CSIPersistentVolumeSource{}},
		"no source": {},
	} {
		if got := pvSourceKind(&src); got != want {
			t.Errorf("PVSourceKind = %q, want %q", got, want)
		}
	}
}
