package flexvolume

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func pvSpec() *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: "example.com/ebs/pv-1", Plugin: "example.com/ebs", PVName: "pv-1",
		PVSource: &v1.PersistentVolumeSource{FlexVolume: &v1.FlexPersistentVolumeSource{Driver: "example.com/ebs", FSType: "ext4"}}}
}

// TestAttachWithController follows the kubelet's calls for a driver that
// attaches, with the attach/detach controller: the Node's
// volumesAttached, waitforattach, getvolumename and mountdevice, then
// mount of the pod, and the way back.
func TestAttachWithController(t *testing.T) {
	rec := &recorder{replies: map[string]string{cmdWaitForAttach: `{"status":"Success","device":"/dev/xvdf"}`}}
	d, fm := testDriver(t, "example.com/ebs", defaultCapabilities(), rec, nil)
	node := &v1.Node{}
	d.node = func() (*v1.Node, error) { return node, nil }
	spec := pvSpec()
	ctx := context.Background()
	if caps, _ := d.Capabilities(spec); !caps.Attachable || !caps.Stages {
		t.Fatalf("Capabilities = %+v, want attachable and staged", caps)
	}
	_, err := d.WaitForAttach(ctx, spec)
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "Volume not attached according to node status") {
		t.Fatalf("WaitForAttach before the controller attached = %v, want not ready", err)
	}
	node.Status.VolumesAttached = []v1.AttachedVolume{{Name: "example.com/ebs/pv-1", DevicePath: "/dev/sdf"}}
	pc, err := d.WaitForAttach(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if pc[publishDevicePath] != "/dev/xvdf" {
		t.Errorf("publish context = %v, want waitforattach's device", pc)
	}
	c := rec.last(cmdWaitForAttach)
	if c[2] != "/dev/sdf" || options(t, c, 3)["kubernetes.io/pvOrVolumeName"] != "pv-1" {
		t.Errorf("waitforattach call = %q, want the Node's device path and the options", c)
	}
	vol := podVol("data")
	vol.PVName = "pv-1"
	dmp, err := d.MountDevice(ctx, volume.DeviceRequest{Spec: spec, PublishContext: pc, Pod: vol})
	if err != nil {
		t.Fatal(err)
	}
	wantDMP := filepath.Join(d.root, "plugins/kubernetes.io/flexvolume/example.com/ebs/mounts/pv-1")
	if dmp != wantDMP {
		t.Errorf("MountDevice = %s, want %s", dmp, wantDMP)
	}
	if c := rec.last(cmdMountDevice); len(c) != 5 || c[2] != wantDMP || c[3] != "/dev/xvdf" || options(t, c, 4)["kubernetes.io/fsType"] != "ext4" {
		t.Errorf("mountdevice call = %q, want [exe mountdevice %s /dev/xvdf {json}]", c, wantDMP)
	}
	// The driver's mountdevice mounted it (the fake mounter is told).
	if err := fm.Mount("/dev/xvdf", dmp, "ext4", nil); err != nil {
		t.Fatal(err)
	}
	err = d.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if c := rec.last(cmdUnmountDevice); !reflect.DeepEqual(c, []string{d.exe, cmdUnmountDevice, wantDMP}) {
		t.Errorf("unmountdevice call = %q", c)
	}
	want := []string{cmdWaitForAttach, cmdGetVolumeName, cmdMountDevice, cmdUnmountDevice}
	if got := rec.commands(); !reflect.DeepEqual(got, want) {
		t.Errorf("driver called %v, want %v", got, want)
	}
}

func TestSelfAttachAndDetach(t *testing.T) {
	rec := &recorder{replies: map[string]string{cmdAttach: `{"status":"Success","device":"/dev/sdg"}`, cmdWaitForAttach: `{"status":"Not supported"}`}}
	d, _ := testDriver(t, "example.com/ebs", defaultCapabilities(), rec, nil)
	ctx := context.Background()
	pc, err := d.Attach(ctx, pvSpec())
	if err != nil {
		t.Fatal(err)
	}
	if pc[publishDevicePath] != "/dev/sdg" {
		t.Errorf("publish context = %v, want attach's device (waitforattach not supported)", pc)
	}
	if c := rec.last(cmdAttach); len(c) != 4 || c[3] != "node-1" || options(t, c, 2)["kubernetes.io/pvOrVolumeName"] != "pv-1" {
		t.Errorf("attach call = %q, want [exe attach {json} node-1]", c)
	}
	if err := d.Detach(ctx, pvSpec()); err != nil {
		t.Fatal(err)
	}
	if c := rec.last(cmdDetach); !reflect.DeepEqual(c, []string{d.exe, cmdDetach, "pv-1", "node-1"}) {
		t.Errorf("detach call = %q", c)
	}
}

func TestNoAttachWithoutTheCapability(t *testing.T) {
	rec := &recorder{}
	d, _ := testDriver(t, "example.com/nfs", capabilities{Attach: false, FSGroup: true}, rec, nil)
	caps, _ := d.Capabilities(pvSpec())
	if caps.Attachable || caps.Stages || !caps.OwnershipChange {
		t.Errorf("Capabilities = %+v, want neither attached nor staged, ownership changed", caps)
	}
	if pc, err := d.WaitForAttach(context.Background(), pvSpec()); pc != nil || err != nil {
		t.Errorf("WaitForAttach = %v, %v; want nothing", pc, err)
	}
	if len(rec.commands()) != 0 {
		t.Errorf("driver called %v", rec.commands())
	}
}

func TestUnmountDeviceRefusedWhileReferenced(t *testing.T) {
	rec := &recorder{}
	d, fm := testDriver(t, "example.com/ebs", defaultCapabilities(), rec, nil)
	dmp, err := d.MountDevice(context.Background(), volume.DeviceRequest{Spec: pvSpec(), PublishContext: map[string]string{publishDevicePath: "/dev/x"}})
	if err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(d.root, "pods/uid-1/volumes/example.com~ebs/pv-1")
	if err := fm.Mount("/dev/x", dmp, "ext4", nil); err != nil {
		t.Fatal(err)
	}
	if err := fm.Mount(dmp, podDir, "", []string{"bind"}); err != nil {
		t.Fatal(err)
	}
	err = d.UnmountDevice(context.Background(), volume.DeviceRequest{Spec: pvSpec()})
	if !errors.Is(err, volume.ErrInUse) {
		t.Errorf("UnmountDevice while a pod mounts it = %v, want ErrInUse", err)
	}
	if rec.last(cmdUnmountDevice) != nil {
		t.Error("unmountdevice called while a pod mounts the device")
	}
}

func TestWaitForAttachFailure(t *testing.T) {
	rec := &recorder{replies: map[string]string{cmdWaitForAttach: `{"status":"Failure","message":"device never showed up"}`}}
	d, _ := testDriver(t, "example.com/ebs", defaultCapabilities(), rec, nil)
	d.node = func() (*v1.Node, error) {
		return &v1.Node{Status: v1.NodeStatus{VolumesAttached: []v1.AttachedVolume{{Name: "example.com/ebs/pv-1", DevicePath: "/dev/sdf"}}}}, nil
	}
	_, err := d.WaitForAttach(context.Background(), pvSpec())
	for _, want := range []string{`volume "pv-1" (flexVolume driver example.com/ebs)`, "waitforattach command failed, status: Failure, reason: device never showed up"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("WaitForAttach = %v, want it to say %q", err, want)
		}
	}
}
