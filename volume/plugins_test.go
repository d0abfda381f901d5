package volume_test

import (
	"errors"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	k8scache "k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/image"
)

// TestRegistryWithTheBuiltInPlugins: each source of a pod volume finds
// its plugin among CSI and image, by its source and by its unique name.
func TestRegistryWithTheBuiltInPlugins(t *testing.T) {
	r, err := volume.NewRegistry(newCSIPlugin(), image.New())
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	for _, tt := range []struct {
		src  v1.VolumeSource
		want string
	}{
		{v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}, podvol.CSIPluginName},
		{v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "drv", FSType: str("ext4")}}, podvol.CSIPluginName},
		{v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}, podvol.CSIPluginName},
		{v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd"}}, podvol.CSIPluginName}, // CSI migration
		{v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "quay.io/x/tools:1"}}, image.PluginName},
	} {
		kind := volume.SourceKind(&tt.src)
		p, err := r.ForSource(&v1.Volume{Name: "data", VolumeSource: tt.src})
		if err != nil || p.Name() != tt.want {
			t.Errorf("ForSource(%s) = %v, %v; want %s", kind, p, err, tt.want)
		}
	}
	for _, tt := range []struct {
		src  v1.VolumeSource
		want string
	}{
		{v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}},
			`volume "data" of kind emptyDir: no volume plugin handles it (registered: kubernetes.io/csi, kubernetes.io/image)`},
		{v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}},
			`volume "data" of kind nfs: no volume plugin handles it (registered: kubernetes.io/csi, kubernetes.io/image)`},
	} {
		_, err := r.ForSource(&v1.Volume{Name: "data", VolumeSource: tt.src})
		if err == nil || err.Error() != tt.want || !errors.Is(err, volume.ErrNoPlugin) {
			t.Errorf("ForSource = %v, want %q wrapping ErrNoPlugin", err, tt.want)
		}
	}
	for name, want := range map[podvol.UniqueVolumeName]string{
		podvol.CSIVolumeName("drv", "h"):  podvol.CSIPluginName,
		"kubernetes.io/csi/uid-1-data":    podvol.CSIPluginName, // inline CSI
		"kubernetes.io/image/uid-1-tools": image.PluginName,
	} {
		if p, err := r.ForVolume(name); err != nil || p.Name() != want {
			t.Errorf("ForVolume(%s) = %v, %v; want %s", name, p, err, want)
		}
	}
}

// newCSIPlugin is the CSI plugin as New builds it, with empty listers: what
// CanSupport answers needs nothing more.
func newCSIPlugin() volume.Plugin {
	p, err := csiplugin.New(csiplugin.Config{
		RootDir: os.TempDir(), NodeName: "node",
		CSIDriverLister:        storagelisters.NewCSIDriverLister(k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})),
		VolumeAttachmentLister: storagelisters.NewVolumeAttachmentLister(k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{})),
	})
	if err != nil {
		panic(err)
	}
	return p
}
