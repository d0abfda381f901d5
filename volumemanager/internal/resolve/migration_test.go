package resolve

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

// TestPodVolumesMigrated: inline volumes of the migrated in-tree
// plugins are the CSI plugin's; other in-tree kinds are not.
func TestPodVolumesMigrated(t *testing.T) {
	sources := map[string]v1.VolumeSource{
		"ebs": {AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}},
		"gce": {GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "d"}},
		// Managed: the API server's default kind, Shared, has no CSI translation.
		"azdisk":   {AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "/subscriptions/s/disks/d", Kind: ptr.To(v1.AzureManagedDisk)}},
		"azfile":   {AzureFile: &v1.AzureFileVolumeSource{SecretName: "s", ShareName: "sh"}},
		"cinder":   {Cinder: &v1.CinderVolumeSource{VolumeID: "v"}},
		"vsphere":  {VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{VolumePath: "[ds] vol.vmdk"}},
		"portworx": {PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "v"}},
		"hostpath": {HostPath: &v1.HostPathVolumeSource{Path: "/x"}},
		"nfs":      {NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}},
		"empty":    {EmptyDir: &v1.EmptyDirVolumeSource{}},
		"unused":   {GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "unused"}},
	}
	var spec csitest.PodSpec
	for _, name := range []string{"ebs", "gce", "azdisk", "azfile", "cinder", "vsphere", "portworx", "hostpath", "nfs", "empty"} {
		spec.Volumes = append(spec.Volumes, csitest.PodVolume{Name: name, Source: sources[name]})
	}
	pod := csitest.Pod("ns", "p", spec)
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "unused", VolumeSource: sources["unused"]})
	var vols []PodVolume
	var got []string
	for _, v := range PodVolumes(pod, testPlugins) {
		if v.err == nil && v.plugin.Name() == podvol.CSIPluginName {
			vols = append(vols, v)
			got = append(got, v.Name)
		}
	}
	if want := []string{"ebs", "gce", "azdisk", "azfile", "cinder", "vsphere", "portworx"}; !slices.Equal(got, want) {
		t.Errorf("podVolumes of the CSI plugin = %q, want %q", got, want)
	}

	// Each translates to its driver, as a persistent volume whose
	// directory name is a valid path component.
	r := &Resolver{Plugins: testPlugins}
	wantDriver := map[string]string{"ebs": awsEBS, "gce": gcePD, "azdisk": "disk.csi.azure.com", "azfile": "file.csi.azure.com",
		"cinder": "cinder.csi.openstack.org", "vsphere": "csi.vsphere.vmware.com", "portworx": "pxd.portworx.com"}
	for _, v := range vols {
		dv, err := r.resolveVolume(pod, &v)
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		s := dv.Spec
		if s.Driver != wantDriver[v.Name] || s.Ephemeral || s.MigratedFrom == "" || s.Name != podvol.CSIVolumeName(s.Driver, s.VolumeHandle) {
			t.Errorf("%s: spec = %+v", v.Name, s)
		}
		if _, err := ondisk.PodVolumeDir("/root", types.UID("uid"), ondisk.VolumeDirName(&s, dv.Volume)); err != nil {
			t.Errorf("%s: directory name %q: %v", v.Name, s.PVName, err)
		}
	}
}

// The CSI drivers in-tree volumes are migrated to.
const (
	gcePD  = "pd.csi.storage.gke.io"
	awsEBS = "ebs.csi.aws.com"
)
