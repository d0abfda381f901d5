package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

const (
	gcePD  = "pd.csi.storage.gke.io"
	awsEBS = "ebs.csi.aws.com"
)

// zoned puts a PV in zone us-central1-a.
func zoned(pv *v1.PersistentVolume) {
	pv.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
}

// inTreeClaim creates a bound PVC name in namespace ns and its PV with the
// in-tree source src instead of a CSI one, and returns the PV.
func (e *env) inTreeClaim(name string, src v1.PersistentVolumeSource, spec csitest.PVSpec, tweaks ...func(*v1.PersistentVolume)) *v1.PersistentVolume {
	e.t.Helper()
	spec.Driver, spec.Handle = "unused.example.com", "unused"
	pvc, pv := csitest.BoundClaim("ns", name, spec)
	pv.Spec.PersistentVolumeSource = src
	for _, tweak := range tweaks {
		tweak(pv)
	}
	e.create(pvc, pv)
	return pv
}

// attached creates the VolumeAttachment named name as the attach/detach
// controller and the external-attacher leave it: attached, for driver, with
// source (the PV's name, or the translated spec of an inline volume).
func (e *env) attached(name, driver string, source storagev1.VolumeAttachmentSource, metadata map[string]string) {
	e.t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node, Source: source},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: metadata},
	}
	e.create(va)
}

// request returns the one recorded request of method, failing if there is
// not exactly one.
func (e *env) request(method string) proto.Message {
	e.t.Helper()
	var found []proto.Message
	for _, r := range e.drv.Requests() {
		if r.Method == method {
			found = append(found, r.Req)
		}
	}
	if len(found) != 1 {
		e.t.Fatalf("%d %s requests, want 1", len(found), method)
	}
	return found[0]
}

func checkRequest(t *testing.T, method string, got, want proto.Message) {
	t.Helper()
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("%s request (-want +got):\n%s", method, diff)
	}
}

func readVolData(t *testing.T, dir string) ondisk.VolumeData {
	t.Helper()
	d, err := ondisk.LoadVolumeData(dir)
	if err != nil {
		t.Fatal(err)
	}
	return *d
}

// TestMigratedPV: a pod whose claim is bound to a gcePersistentDisk PV
// mounts through the GCE PD CSI driver, with the translated handle in the
// unique name, the VolumeAttachment it waits for, the requests and
// vol_data.json; then unmounts.
func TestMigratedPV(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{DriverName: gcePD}, attachRequired: true})
	pv := e.inTreeClaim("gce", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"}},
		csitest.PVSpec{MountOptions: []string{"noatime"}}, zoned)
	const handle = "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1"
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "gce"}}})

	// Nothing attached yet: the pod waits for the VolumeAttachment of the
	// translated handle and driver, which the attach/detach controller
	// names from the same translation.
	vaName := csiplugin.AttachmentName(handle, gcePD, node)
	err := e.mount(pod, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "VolumeAttachment "+vaName+" of driver "+gcePD) || !strings.Contains(err.Error(), "unmounted volumes=[data]") {
		t.Fatalf("WaitForAttachAndMount = %v, want it waiting for VolumeAttachment %s", err, vaName)
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("staged %d times before the volume was attached", n)
	}
	e.attached(vaName, gcePD, storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}, map[string]string{"devicePath": "/dev/sdb"})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	name := podvol.CSIVolumeName(gcePD, handle)
	if got := e.vm.GetVolumesInUse(); !slices.Equal(got, []podvol.UniqueVolumeName{name}) {
		t.Errorf("volumes in use = %v, want [%s]", got, name)
	}
	staging, err := ondisk.StagingPath(e.root, gcePD, handle)
	if err != nil {
		t.Fatal(err)
	}
	target, err := ondisk.PodVolumePath(e.root, pod.UID, pv.Name)
	if err != nil {
		t.Fatal(err)
	}
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"noatime"}}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	context := map[string]string{"partition": ""}
	publishContext := map[string]string{"devicePath": "/dev/sdb"}
	checkRequest(t, "NodeStageVolume", e.request("NodeStageVolume"), &csi.NodeStageVolumeRequest{
		VolumeId: handle, PublishContext: publishContext, StagingTargetPath: staging, VolumeCapability: capability, VolumeContext: context,
	})
	checkRequest(t, "NodePublishVolume", e.request("NodePublishVolume"), &csi.NodePublishVolumeRequest{
		VolumeId: handle, PublishContext: publishContext, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, VolumeContext: context,
	})
	if got, want := readVolData(t, filepath.Dir(staging)), (ondisk.VolumeData{SpecVolID: pv.Name, VolumeHandle: handle, DriverName: gcePD}); got != want {
		t.Errorf("staging vol_data.json = %+v, want %+v", got, want)
	}
	if got, want := readVolData(t, filepath.Dir(target)), (ondisk.VolumeData{SpecVolID: pv.Name, VolumeHandle: handle, DriverName: gcePD,
		NodeName: node, AttachmentID: vaName, VolumeLifecycleMode: "Persistent"}); got != want {
		t.Errorf("pod vol_data.json = %+v, want %+v", got, want)
	}

	e.unmount(pod)
	eventually(t, "staging directory removed", func() bool { _, err := os.Stat(filepath.Dir(staging)); return os.IsNotExist(err) })
	if got := e.request("NodeUnstageVolume").(*csi.NodeUnstageVolumeRequest); got.GetVolumeId() != handle || got.GetStagingTargetPath() != staging {
		t.Errorf("NodeUnstageVolume = %v", got)
	}
}

// TestMigratedInlineVolume: an inline awsElasticBlockStore volume is
// translated to a persistent EBS CSI volume: attached (the VolumeAttachment
// of the translated handle, with the inline spec as its source, as the
// attach/detach controller creates it), staged and published in the
// directory named after the translated PV.
func TestMigratedInlineVolume(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{DriverName: awsEBS}, attachRequired: true})
	src := v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-0abc", FSType: "xfs", ReadOnly: true}}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "ebs", Source: src, ReadOnly: true}}})
	const handle = "vol-0abc"
	vaName := csiplugin.AttachmentName(handle, awsEBS, node)
	fs := v1.PersistentVolumeFilesystem
	e.attached(vaName, awsEBS, storagev1.VolumeAttachmentSource{InlineVolumeSpec: &v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: awsEBS, VolumeHandle: handle, ReadOnly: true, FSType: "xfs",
			VolumeAttributes: map[string]string{"partition": "0"}}},
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, VolumeMode: &fs,
	}}, nil)
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	const pvName = awsEBS + "-" + handle // the kubelet's spec name of a translated inline volume
	staging, err := ondisk.StagingPath(e.root, awsEBS, handle)
	if err != nil {
		t.Fatal(err)
	}
	target, err := ondisk.PodVolumePath(e.root, pod.UID, pvName)
	if err != nil {
		t.Fatal(err)
	}
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	context := map[string]string{"partition": "0"}
	checkRequest(t, "NodeStageVolume", e.request("NodeStageVolume"), &csi.NodeStageVolumeRequest{
		VolumeId: handle, PublishContext: map[string]string{}, StagingTargetPath: staging, VolumeCapability: capability, VolumeContext: context,
	})
	checkRequest(t, "NodePublishVolume", e.request("NodePublishVolume"), &csi.NodePublishVolumeRequest{
		VolumeId: handle, PublishContext: map[string]string{}, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability,
		VolumeContext: context, Readonly: true,
	})
	if got, want := readVolData(t, filepath.Dir(target)), (ondisk.VolumeData{SpecVolID: pvName, VolumeHandle: handle, DriverName: awsEBS,
		NodeName: node, AttachmentID: vaName, VolumeLifecycleMode: "Persistent"}); got != want {
		t.Errorf("pod vol_data.json = %+v, want %+v", got, want)
	}
	mounted := e.vm.GetMountedVolumesForPod(pod.UID)
	if len(mounted) != 1 || mounted[0].SpecName != "ebs" || !mounted[0].ReadOnly || mounted[0].Path != target {
		t.Errorf("mounted = %+v", mounted)
	}
	if got, want := e.vm.GetVolumesInUse(), []podvol.UniqueVolumeName{podvol.CSIVolumeName(awsEBS, handle)}; !slices.Equal(got, want) {
		t.Errorf("volumes in use = %v, want %v", got, want)
	}
	e.unmount(pod)
	eventually(t, "volume unstaged", func() bool { return len(e.drv.StagedVolumes()) == 0 && len(e.drv.PublishedVolumes()) == 0 })
	if entries, _ := os.ReadDir(filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi")); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

// TestMigratedDriverNotRegistered: a migrated volume whose CSI driver has
// not registered waits with an error naming the translated driver and the
// in-tree plugin, and mounts once the driver registers.
func TestMigratedDriverNotRegistered(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{DriverName: gcePD}, attachRequired: true, noRegister: true})
	pv := e.inTreeClaim("gce", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}, csitest.PVSpec{})
	const handle = "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"
	e.attached(csiplugin.AttachmentName(handle, gcePD, node), gcePD, storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}, nil)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "gce"}}})
	err := e.mount(pod, 300*time.Millisecond)
	for _, want := range []string{"driver name " + gcePD + " not found in the list of registered CSI drivers", "migrated from in-tree kubernetes.io/gce-pd", "unmounted volumes=[data]", "ns/p"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("WaitForAttachAndMount = %v, want it to say %q", err, want)
		}
	}
	e.register()
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.unmount(pod)
}

// TestMigrationBadInput: sources without a translation, and translations
// that fail, are errors naming the pod, the volume and the cause; the
// pod's other volumes are not held up by them.
func TestMigrationBadInput(t *testing.T) {
	e := newEnv(t, envOptions{})
	iscsi := e.inTreeClaim("iscsi", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}}, csitest.PVSpec{})
	badEBS := e.inTreeClaim("badebs", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/"}}, csitest.PVSpec{})
	e.inTreeClaim("gceblock", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "d"}}, csitest.PVSpec{Block: true})
	ebsInline := v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws:///"}}}
	tests := []struct {
		name string
		pod  *v1.Pod
		want []string
	}{
		{"iSCSI PV", csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "iscsi"}}}),
			[]string{`pod ns/a: unmounted volumes=[data]; volume "data": `, "PV " + iscsi.Name + " of kind iscsi: no volume plugin handles it", `use the CSI driver "iscsi.csi.k8s.io"`}},
		{"EBS PV with a bad volume ID", csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "badebs"},
		}}),
			[]string{`pod ns/b: unmounted volumes=[data]; volume "data": `, "PV " + badEBS.Name + ": translating its kubernetes.io/aws-ebs source to CSI", "Invalid format for AWS volume"}},
		{"inline EBS with a bad volume ID", csitest.Pod("ns", "c", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: ebsInline.Name, Source: ebsInline.VolumeSource},
		}}),
			[]string{`pod ns/c: unmounted volumes=[ebs]; volume "ebs": `, "translating inline kubernetes.io/aws-ebs volume to CSI"}},
		{"inline GCE PD as a device", csitest.Pod("ns", "d", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "pd", Block: true,
			Source: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "d"}}}}}),
			[]string{`pod ns/d: unmounted volumes=[pd]; volume "pd": `, "volume has volumeMode Filesystem, but is specified in volumeDevices"}},
		{"GCE PD block PV in volumeMounts", csitest.Pod("ns", "e", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "gceblock"},
		}}),
			[]string{`pod ns/e: unmounted volumes=[data]; volume "data": `, "volume has volumeMode Block, but is specified in volumeMounts"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.mount(tc.pod, 300*time.Millisecond)
			// A PV with no source nodevol can mount is final (ErrFinal)
			// at once; the others run out of time.
			ended := context.DeadlineExceeded
			if tc.name == "iSCSI PV" {
				ended = ErrFinal
			}
			if err == nil || !errors.Is(err, ended) {
				t.Fatalf("WaitForAttachAndMount = %v, want it to end with %v", err, ended)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("WaitForAttachAndMount = %v, want it to say %q", err, want)
				}
			}
		})
	}
	for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
		if n := e.drv.Calls(m); n != 0 {
			t.Errorf("the driver got %d %s requests", n, m)
		}
	}
}

// TestMigratedRestartReconstructs: after a restart, the volumes of a
// migrated PV and of an inline in-tree volume found on disk get the names
// the populator gives them (the translated driver and handle), so the pod
// added again keeps them; when it goes they are torn down and nothing is
// left.
func TestMigratedRestartReconstructs(t *testing.T) {
	drv := csitest.New(t, csitest.Options{DriverName: gcePD, CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "gce", csitest.PVSpec{Driver: "unused.example.com", Handle: "unused"})
	pv.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}
	client := fake.NewClientset(csitest.CSIDriver(gcePD, csitest.CSIDriverSpec{}), pvc, pv)
	root := t.TempDir()
	inline := v1.Volume{Name: "inline", VolumeSource: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-2"}}}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "gce"},
		{Name: inline.Name, Source: inline.VolumeSource},
	}})
	mountPod := func(vm *VolumeManager) {
		t.Helper()
		vm.AddPod(pod)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	vm1, stop1 := startVM(t, client, root, drv)
	mountPod(vm1)
	stop1()
	publishes := drv.Calls("NodePublishVolume")

	vm2, stop2 := startVM(t, client, root, drv)
	defer stop2()
	want := []podvol.UniqueVolumeName{
		podvol.CSIVolumeName(gcePD, "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"),
		podvol.CSIVolumeName(gcePD, "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-2"),
	}
	if got := knownVolumes(vm2); !slices.Equal(got, want) {
		t.Fatalf("volumes in use after the restart = %v, want %v", got, want)
	}
	mountPod(vm2)
	if got := drv.Calls("NodePublishVolume") - publishes; got != 2 {
		t.Errorf("NodePublishVolume calls after the restart = %d, want 2 (the uncertain mounts published again)", got)
	}
	if got := knownVolumes(vm2); !slices.Equal(got, want) {
		t.Errorf("volumes in use = %v, want %v (no second volume of another name)", got, want)
	}
	vm2.MarkPodsSynced()
	vm2.DeletePod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm2.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volumes unstaged", func() bool { return len(knownVolumes(vm2)) == 0 })
	eventually(t, "staging directories removed", func() bool {
		m, _ := filepath.Glob(filepath.Join(root, "plugins", "kubernetes.io", "csi", gcePD, "*"))
		return len(m) == 0
	})
	if got := drv.StagedVolumes(); len(got) != 0 {
		t.Errorf("staged volumes = %v", got)
	}
	if m, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumes", "kubernetes.io~csi", "*")); len(m) != 0 {
		t.Errorf("pod volume directories left: %v", m)
	}
}

// TestMigratedPVExpansion: a mounted gcePersistentDisk PV grown by the
// controller is expanded on the node through the GCE PD CSI driver, with
// the translated handle, as a CSI PV is.
func TestMigratedPVExpansion(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{DriverName: gcePD, Expand: true}, clusterInformers: true}) // the resize seen at once
	pv := e.inTreeClaim("gce", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"}},
		csitest.PVSpec{Capacity: "1Gi"}, zoned)
	const handle = "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1"
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "gce"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := e.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "gce", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
	if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "claim reports the new size", func() bool {
		c, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "gce", metav1.GetOptions{})
		got := c.Status.Capacity[v1.ResourceStorage]
		return err == nil && got.Cmp(resource.MustParse("2Gi")) == 0
	})
	exp := e.request("NodeExpandVolume").(*csi.NodeExpandVolumeRequest)
	target, err := ondisk.PodVolumePath(e.root, pod.UID, pv.Name)
	if err != nil {
		t.Fatal(err)
	}
	if exp.GetVolumeId() != handle || exp.GetVolumePath() != target || exp.GetCapacityRange().GetRequiredBytes() != 2<<30 {
		t.Errorf("NodeExpandVolume = %v, want volume %s at %s grown to 2Gi", exp, handle, target)
	}
}
