package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	csitranslation "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestMigrationEndToEnd: the loop driver runs under the AWS EBS CSI
// driver's name, ebs.csi.aws.com. A pod uses a claim bound to an in-tree
// awsElasticBlockStore PV and an inline awsElasticBlockStore volume, each
// naming a loop driver volume. Both are translated to CSI, attached (the
// VolumeAttachments the attach/detach controller creates from the same
// translation, attached by the fake external-attacher), staged as ext4 on
// loop devices and published; the pod writes and reads; when it goes,
// nothing is left: no mount, loop device or directory under the root.
func TestMigrationEndToEnd(t *testing.T) {
	roottest.Require(t)
	const (
		node   = "node-1"
		driver = "ebs.csi.aws.com"
	)
	root, err := csitest.ShortTempDir("nv-mig-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sock := filepath.Join(root, "plugins", driver, "csi.sock")
	p, err := startSelf(ctx, filepath.Join(root, "loopdriver.log"), sock, loopDriverCommand,
		"--endpoint", "unix://"+sock, "--nodeid", node, "--statedir", filepath.Join(root, "loopdriver"), "--drivername", driver)
	if err != nil {
		t.Fatalf("the loop driver: %v", err)
	}
	drv := &demoDriver{name: driver, endpoint: sock, mounter: mount.New(""), real: true, stop: p.stop, kill: p.kill, exited: p.exited}
	defer drv.stop()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	create := func(name string) string {
		resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name:          name,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolume().GetVolumeId()
	}
	pvHandle, inlineHandle := create("in-tree-pv"), create("in-tree-inline")

	// The in-tree PV names the volume by its bare ID (the aws:// form wants
	// an ID starting with vol-, which the loop driver's are not).
	pvc, pv := csitest.BoundClaim("demo", "legacy", csitest.PVSpec{Driver: "unused.example.com", Handle: "unused"})
	pv.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: pvHandle, FSType: "ext4"}}
	inline := v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: inlineHandle, FSType: "ext4"}}}
	pod := csitest.Pod("demo", "legacy-app", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "legacy"},
		{Name: inline.Name, Source: inline.VolumeSource},
	}})

	client := fake.NewClientset(csitest.CSIDriver(driver, csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv)
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{Driver: driver})
	// The attach/detach controller's part: it translates too, and names
	// the VolumeAttachments after the translated handle and driver.
	tr := csitranslation.New()
	csiPV, err := tr.TranslateInTreePVToCSI(klog.Background(), pv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := csitest.AttachVolume(ctx, client, csiPV, node); err != nil {
		t.Fatal(err)
	}
	inlinePV, err := tr.TranslateInTreeInlineVolumeToCSI(klog.Background(), &inline, pod.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	inlineVA := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: csiplugin.AttachmentName(inlineHandle, driver, node)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{InlineVolumeSpec: &inlinePV.Spec}},
	}
	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, inlineVA, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter}, driver, sock)

	vm.AddPod(pod)
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pod); err != nil {
		t.Fatal(err)
	}
	wantDirs := map[string]string{"data": pv.Name, "scratch": driver + "-" + inlineHandle}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 2 {
		t.Fatalf("mounted volumes %+v", vols)
	}
	for _, v := range vols {
		want := filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", wantDirs[v.SpecName], "mount")
		if v.Path != want {
			t.Errorf("volume %s at %s, want %s", v.SpecName, v.Path, want)
		}
		if got := source(drv.mounter, v.Path); !strings.HasPrefix(got, "ext4 on /dev/loop") {
			t.Errorf("volume %s: %s is %q, want ext4 on a loop device", v.SpecName, v.Path, got)
		}
		file := filepath.Join(v.Path, "hello.txt")
		if err := os.WriteFile(file, []byte(v.SpecName), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(file); err != nil || string(got) != v.SpecName {
			t.Errorf("reading back %s: %q, %v", file, got, err)
		}
	}
	inUse := vm.GetVolumesInUse()
	if len(inUse) != 2 || inUse[0] != podvol.CSIVolumeName(driver, pvHandle) && inUse[1] != podvol.CSIVolumeName(driver, pvHandle) {
		t.Errorf("volumes in use = %v, want the translated handles %s and %s", inUse, pvHandle, inlineHandle)
	}
	for _, h := range []string{pvHandle, inlineHandle} {
		staging, err := ondisk.StagingPath(root, driver, h)
		if err != nil {
			t.Fatal(err)
		}
		if got := source(drv.mounter, staging); !strings.HasPrefix(got, "ext4 on /dev/loop") {
			t.Errorf("volume %s: staging path %s is %q, want ext4 on a loop device", h, staging, got)
		}
	}

	deletePods(t, ctx, vm, []*v1.Pod{pod})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}
