package flexvolume

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func inlineSpec(driver string, src v1.FlexVolumeSource) *podvol.VolumeSpec {
	src.Driver = driver
	return &podvol.VolumeSpec{Name: podvol.UniqueVolumeName(driver + "/uid-1-data"), Plugin: driver, Mode: podvol.Filesystem,
		Source: &v1.VolumeSource{FlexVolume: &src}, Ephemeral: true}
}

func podVol(name string) podvol.PodVolume {
	gid := int64(1234)
	return podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "web", ServiceAccount: "sa"}, SpecName: name, FSGroup: &gid}
}

// TestSetUpCall checks the mount call as the kubelet makes it: the
// executable, the argument order and every JSON option, secrets base64.
func TestSetUpCall(t *testing.T) {
	rec := &recorder{}
	secrets := fakeSecrets{"ns/creds": {Type: "example.com/cifs", Data: map[string][]byte{"password": []byte("s3cret"), "user": []byte("bob")}}}
	d, _ := testDriver(t, "example.com/cifs", capabilities{}, rec, secrets)
	spec := inlineSpec("example.com/cifs", v1.FlexVolumeSource{FSType: "cifs", ReadOnly: true, SecretRef: &v1.LocalObjectReference{Name: "creds"},
		Options: map[string]string{"share": "//srv/data", "kubernetes.io/fsType": "overridden"}})
	dir, err := d.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: podVol("data")})
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(d.root, "pods/uid-1/volumes/example.com~cifs/data")
	if dir != want {
		t.Errorf("SetUp = %s, want %s", dir, want)
	}
	c := rec.last(cmdMount)
	if c == nil || c[0] != "/plugins/example.com~cifs/cifs" || len(c) != 4 || c[2] != want {
		t.Fatalf("mount call = %q, want [/plugins/example.com~cifs/cifs mount %s {json}]", c, want)
	}
	got := options(t, c, 3)
	wantOpts := map[string]string{
		"kubernetes.io/fsType": "overridden", "kubernetes.io/readwrite": "ro", "kubernetes.io/pvOrVolumeName": "data",
		"kubernetes.io/pod.name": "web", "kubernetes.io/pod.namespace": "ns", "kubernetes.io/pod.uid": "uid-1",
		"kubernetes.io/serviceAccount.name": "sa", "kubernetes.io/mounterArgs.FsGroup": "1234",
		"kubernetes.io/secret/password": base64.StdEncoding.EncodeToString([]byte("s3cret")),
		"kubernetes.io/secret/user":     base64.StdEncoding.EncodeToString([]byte("bob")),
		"share":                         "//srv/data",
	}
	if !reflect.DeepEqual(got, wantOpts) {
		t.Errorf("mount options = %v\nwant %v", got, wantOpts)
	}
	if cmds := rec.commands(); !reflect.DeepEqual(cmds, []string{cmdMount}) {
		t.Errorf("driver called %v, want only mount", cmds)
	}
}

func TestSetUpPVOptions(t *testing.T) {
	rec := &recorder{}
	secrets := fakeSecrets{"other/creds": {Type: "example.com/cifs", Data: map[string][]byte{"k": []byte("v")}}}
	d, _ := testDriver(t, "example.com/cifs", capabilities{}, rec, secrets)
	spec := &podvol.VolumeSpec{Name: "example.com/cifs/uid-1-pv-1", Plugin: "example.com/cifs", PVName: "pv-1",
		PVSource: &v1.PersistentVolumeSource{FlexVolume: &v1.FlexPersistentVolumeSource{Driver: "example.com/cifs", FSType: "ext4",
			SecretRef: &v1.SecretReference{Namespace: "other", Name: "creds"}}}}
	vol := podVol("claim-vol")
	vol.PVName, vol.FSGroup = "pv-1", nil
	dir, err := d.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(dir, "/volumes/example.com~cifs/pv-1") {
		t.Errorf("SetUp = %s, want the PV's name as the directory", dir)
	}
	got := options(t, rec.last(cmdMount), 3)
	if got["kubernetes.io/pvOrVolumeName"] != "pv-1" || got["kubernetes.io/readwrite"] != "rw" || got["kubernetes.io/secret/k"] != "dg==" {
		t.Errorf("options = %v, want the PV's name, rw and the secret of the PV's namespace", got)
	}
	if _, ok := got["kubernetes.io/mounterArgs.FsGroup"]; ok {
		t.Errorf("options = %v: an fsGroup without one", got)
	}
}

func TestSetUpErrors(t *testing.T) {
	tests := []struct {
		name    string
		replies map[string]string
		secrets fakeSecrets
		want    []string
	}{
		{"driver failure", map[string]string{cmdMount: `{"status":"Failure","message":"share not found"}`}, nil,
			[]string{`volume "data" (flexVolume driver example.com/cifs) for pod ns/web`, "mount command failed, status: Failure, reason: share not found"}},
		{"secret of another type", nil, fakeSecrets{"ns/creds": {Type: v1.SecretTypeOpaque}},
			[]string{"couldn't get secret ns/creds err: cannot get secret of type example.com/cifs"}},
		{"secret missing", nil, fakeSecrets{}, []string{`couldn't get secret ns/creds err: secrets "creds" not found`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{replies: tt.replies}
			d, _ := testDriver(t, "example.com/cifs", capabilities{}, rec, tt.secrets)
			spec := inlineSpec("example.com/cifs", v1.FlexVolumeSource{SecretRef: &v1.LocalObjectReference{Name: "creds"}})
			if tt.secrets == nil {
				spec.Source.FlexVolume.SecretRef = nil
			}
			_, err := d.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: podVol("data")})
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("SetUp = %v, want it to say %q", err, w)
				}
			}
			if _, err := os.Stat(filepath.Join(d.root, "pods/uid-1/volumes/example.com~cifs/data")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the pod's volume directory after a failed mount: %v, want it removed", err)
			}
		})
	}
}

// TestDefaultsWhenNotSupported checks the kubelet's fallbacks: mount not
// supported bind-mounts the device mount, unmount not supported unmounts.
func TestDefaultsWhenNotSupported(t *testing.T) {
	rec := &recorder{replies: map[string]string{cmdMount: `{"status":"Not supported"}`, cmdUnmount: `{"status":"Not supported"}`,
		cmdGetVolumeName: `{"status":"Not supported"}`}}
	d, fm := testDriver(t, "example.com/lvm", capabilities{}, rec, nil)
	spec := inlineSpec("example.com/lvm", v1.FlexVolumeSource{})
	dir, err := d.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: podVol("data")})
	if err != nil {
		t.Fatal(err)
	}
	log := fm.GetLog()
	wantSrc := filepath.Join(d.root, "plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/data")
	if len(log) != 1 || log[0].Action != "mount" || log[0].Source != wantSrc || log[0].Target != dir || log[0].FSType != "auto" {
		t.Fatalf("mounter log = %+v, want a bind mount of %s at %s", log, wantSrc, dir)
	}
	if err := d.TearDown(context.Background(), volume.MountRequest{Spec: spec, Volume: podVol("data")}); err != nil {
		t.Fatal(err)
	}
	if log := fm.GetLog(); len(log) != 2 || log[1].Action != "unmount" || log[1].Target != dir {
		t.Errorf("mounter log = %+v, want the default unmount of %s", log, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after TearDown: %v, want it removed", dir, err)
	}
	want := []string{cmdMount, cmdGetVolumeName, cmdUnmount}
	if got := rec.commands(); !reflect.DeepEqual(got, want) {
		t.Errorf("driver called %v, want %v", got, want)
	}
}

func TestTearDownCall(t *testing.T) {
	rec := &recorder{}
	d, _ := testDriver(t, "example.com/cifs", capabilities{}, rec, nil)
	spec := inlineSpec("example.com/cifs", v1.FlexVolumeSource{})
	req := volume.MountRequest{Spec: spec, Volume: podVol("data")}
	if err := d.TearDown(context.Background(), req); err != nil || len(rec.commands()) != 0 {
		t.Fatalf("TearDown of a volume never set up = %v, calls %v; want nil and no call", err, rec.commands())
	}
	dir, err := d.SetUp(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.TearDown(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if c := rec.last(cmdUnmount); !reflect.DeepEqual(c, []string{d.exe, cmdUnmount, dir}) {
		t.Errorf("unmount call = %q, want [%s unmount %s]", c, d.exe, dir)
	}
	rec.replies = map[string]string{cmdUnmount: `{"status":"Failure","message":"busy"}`}
	if _, err := d.SetUp(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	err = d.TearDown(context.Background(), req)
	if err == nil || !errors.Is(err, volume.ErrInProgress) || !strings.Contains(err.Error(), "unmount command failed, status: Failure, reason: busy") {
		t.Errorf("TearDown = %v, want the driver's failure, uncertain", err)
	}
}

// TestSetUpKeepsAMount: a pod directory that is a mount point already
// (a volume found on disk, set up again) is kept without a driver call.
func TestSetUpKeepsAMount(t *testing.T) {
	rec := &recorder{}
	d, fm := testDriver(t, "example.com/cifs", capabilities{}, rec, nil)
	dir := filepath.Join(d.root, "pods/uid-1/volumes/example.com~cifs/data")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := fm.Mount("//srv/data", dir, "cifs", nil); err != nil {
		t.Fatal(err)
	}
	got, err := d.SetUp(context.Background(), volume.MountRequest{Spec: inlineSpec("example.com/cifs", v1.FlexVolumeSource{}), Volume: podVol("data")})
	if err != nil || got != dir {
		t.Fatalf("SetUp = %q, %v; want %s", got, err, dir)
	}
	if calls := rec.commands(); len(calls) != 0 {
		t.Errorf("driver called %v on a mounted volume, want no call", calls)
	}
}
