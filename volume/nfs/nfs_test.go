package nfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestNames: the plugin's name, the sources it claims and its
// capabilities (no ownership change, no SELinux mount, no block; read-only
// in every container when the pod's nfs source says so).
func TestNames(t *testing.T) {
	f, _ := newFixture(t, false)
	if f.p.Name() != "kubernetes.io/nfs" {
		t.Errorf("Name = %q", f.p.Name())
	}
	nfsVol := &v1.Volume{VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/e"}}}
	if !f.p.CanSupport(nfsVol) || f.p.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}}}) || f.p.CanSupport(nil) {
		t.Error("CanSupport: wants exactly the pod volumes with an nfs source")
	}
	nfsPV := &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/e"}}}}
	if !f.p.CanSupportPV(nfsPV) || f.p.CanSupportPV(&v1.PersistentVolume{}) || f.p.CanSupportPV(nil) {
		t.Error("CanSupportPV: wants exactly the PVs with spec.nfs")
	}
	for _, tt := range []struct {
		spec *podvol.VolumeSpec
		want volume.Capabilities
	}{
		{inline("u1", "s", "/e", false), volume.Capabilities{}},
		{inline("u1", "s", "/e", true), volume.Capabilities{ReadOnly: true}},
		{pvSpec("u1", "pv1", "s", "/e", nil), volume.Capabilities{}},
	} {
		got, err := f.p.Capabilities(tt.spec)
		if err != nil || !cmp.Equal(got, tt.want) {
			t.Errorf("Capabilities = %+v, %v; want %+v", got, err, tt.want)
		}
	}
}

// TestSetUpMountsTheExport: the mount's source, type and options are the
// kubelet's for each shape of source; a second SetUp mounts nothing more;
// TearDown unmounts and removes the pod's directory, twice over.
func TestSetUpMountsTheExport(t *testing.T) {
	tests := []struct {
		name      string
		spec      *podvol.VolumeSpec
		claimRO   bool
		wantMount string
		wantDir   string
	}{
		{name: "inline", spec: inline("u1", "nfs.example.com", "/exports/a", false),
			wantMount: "nfs.example.com:/exports/a -> pods/u1/volumes/kubernetes.io~nfs/data nfs []"},
		{name: "inline read-only", spec: inline("u1", "10.0.0.5", "/", true),
			wantMount: "10.0.0.5:/ -> pods/u1/volumes/kubernetes.io~nfs/data nfs [ro]"},
		{name: "IPv6 server bracketed", spec: inline("u1", "fd00::5", "/exports/a", false),
			wantMount: "[fd00::5]:/exports/a -> pods/u1/volumes/kubernetes.io~nfs/data nfs []"},
		// The kubelet's IsIPv6String takes an IPv4-mapped address for IPv4.
		{name: "IPv4-mapped IPv6 server not bracketed, as the kubelet", spec: inline("u1", "::ffff:10.0.0.5", "/e", false),
			wantMount: "::ffff:10.0.0.5:/e -> pods/u1/volumes/kubernetes.io~nfs/data nfs []"},
		{name: "PV with mount options, sorted and each once", spec: pvSpec("u1", "pv1", "10.0.0.5", "/e", []string{"nfsvers=4.1", "hard", "", "hard"}),
			wantMount: "10.0.0.5:/e -> pods/u1/volumes/kubernetes.io~nfs/pv1 nfs [hard nfsvers=4.1]", wantDir: "pv1"},
		{name: "PV read-only by the claim, ro joined with the options", spec: pvSpec("u1", "pv1", "10.0.0.5", "/e", []string{"ro", "soft"}), claimRO: true,
			wantMount: "10.0.0.5:/e -> pods/u1/volumes/kubernetes.io~nfs/pv1 nfs [ro soft]", wantDir: "pv1"},
		{name: "PV's own readOnly is not read, as the kubelet", spec: func() *podvol.VolumeSpec {
			s := pvSpec("u1", "pv1", "10.0.0.5", "/e", nil)
			s.PVSource.NFS.ReadOnly = true
			return s
		}(), wantMount: "10.0.0.5:/e -> pods/u1/volumes/kubernetes.io~nfs/pv1 nfs []", wantDir: "pv1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := newFixture(t, false)
			vol := podVol("u1")
			vol.ReadOnly = tt.claimRO
			if tt.spec.PVName != "" {
				vol.PVName = tt.spec.PVName
			}
			req := volume.MountRequest{Spec: tt.spec, Volume: vol}
			got, err := f.p.SetUp(context.Background(), req)
			if err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			dirName := "data"
			if tt.wantDir != "" {
				dirName = tt.wantDir
			}
			if want := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~nfs", dirName); got != want {
				t.Errorf("SetUp = %q, want %q", got, want)
			}
			if diff := cmp.Diff([]string{tt.wantMount}, f.mounts()); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if _, err := f.p.SetUp(context.Background(), req); err != nil || len(f.mounter.GetLog()) != 1 {
				t.Errorf("second SetUp: %v, mounter calls %v; want no second mount", err, f.mounter.GetLog())
			}
			for i := range 2 {
				if err := f.p.TearDown(context.Background(), req); err != nil {
					t.Fatalf("TearDown %d: %v", i, err)
				}
			}
			if len(f.mounter.MountPoints) != 0 || f.exists("pods/u1/volumes/kubernetes.io~nfs/"+dirName) {
				t.Errorf("after TearDown: mounts %v, directory left %v", f.mounts(), f.exists("pods/u1/volumes/kubernetes.io~nfs/"+dirName))
			}
		})
	}
}

// TestSetUpKeepsAMountPoint: a directory that is a mount point already is
// kept as it is, as the kubelet's check does.
func TestSetUpKeepsAMountPoint(t *testing.T) {
	f, _ := newFixture(t, false)
	dir := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/data")
	if err := f.mounter.Mount("old:/e", dir, "nfs", nil); err != nil {
		t.Fatal(err)
	}
	f.mounter.ResetLog()
	if _, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: inline("u1", "s", "/e", false), Volume: podVol("u1")}); err != nil {
		t.Fatal(err)
	}
	if log := f.mounter.GetLog(); len(log) != 0 {
		t.Errorf("SetUp on a mount point mounted again: %v", log)
	}
}

// TestSetUpSteps: every change SetUp and TearDown make is announced.
func TestSetUpSteps(t *testing.T) {
	f, _ := newFixture(t, false)
	req := volume.MountRequest{Spec: inline("u1", "s", "/e", false), Volume: podVol("u1")}
	if _, err := f.p.SetUp(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := f.p.TearDown(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mkdir pods", "mkdir pods/u1", "mkdir pods/u1/volumes", "mkdir pods/u1/volumes/kubernetes.io~nfs",
		"mkdir pods/u1/volumes/kubernetes.io~nfs/data", "mount pods/u1/volumes/kubernetes.io~nfs/data",
		"unmount pods/u1/volumes/kubernetes.io~nfs/data", "remove pods/u1/volumes/kubernetes.io~nfs/data",
	}
	if diff := cmp.Diff(want, f.steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
}

// TestSetUpRefusals: a source without server or path, a symlink planted
// as the pod's directory, and a bad name are refused before anything is
// mounted.
func TestSetUpRefusals(t *testing.T) {
	tests := []struct {
		name    string
		spec    *podvol.VolumeSpec
		vol     func(podvol.PodVolume) podvol.PodVolume
		plant   func(t *testing.T, f *fixture)
		wantErr string
	}{
		{name: "no server", spec: inline("u1", "", "/e", false), wantErr: `needs a server and a path (server "", path "/e")`},
		{name: "no path", spec: inline("u1", "s", "", false), wantErr: `needs a server and a path (server "s", path "")`},
		{name: "no nfs source", spec: &podvol.VolumeSpec{Name: "kubernetes.io/nfs/u1-data", Plugin: PluginName}, wantErr: "has no nfs source"},
		{name: "bad volume name", spec: inline("u1", "s", "/e", false), vol: func(v podvol.PodVolume) podvol.PodVolume { v.SpecName = ".."; return v },
			wantErr: `invalid volume name ".."`},
		{name: "symlink as the pod's directory", spec: inline("u1", "s", "/e", false), plant: func(t *testing.T, f *fixture) {
			base := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs")
			if err := os.Symlink(t.TempDir(), filepath.Join(base, "data")); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "symlink"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := newFixture(t, false)
			if tt.plant != nil {
				tt.plant(t, f)
			}
			vol := podVol("u1")
			if tt.vol != nil {
				vol = tt.vol(vol)
			}
			_, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: tt.spec, Volume: vol})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "pod ns/pod-u1") {
				t.Fatalf("SetUp error = %v, want one naming the pod and %q", err, tt.wantErr)
			}
			if len(f.mounter.GetLog()) != 0 {
				t.Errorf("a refused SetUp mounted: %v", f.mounter.GetLog())
			}
			if tt.plant == nil && f.exists("pods") {
				t.Error("a refused SetUp made directories")
			}
		})
	}
}

// TestSetUpFailures: a failed mount names the pod, the volume, the server
// and the mounter's error, which is also the pod event's cause; it is
// taken back (its directory removed; a mount it left unmounted first),
// and is Uncertain only when a mount may remain.
func TestSetUpFailures(t *testing.T) {
	tests := []struct {
		name          string
		leave         bool
		failUnmount   bool
		wantUncertain bool
		wantDir       bool
	}{
		{name: "mount fails"},
		{name: "mount fails and leaves a mount, taken back", leave: true},
		{name: "mount fails and leaves a mount that cannot be unmounted", leave: true, failUnmount: true, wantUncertain: true, wantDir: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := newFixture(t, false)
			f.flaky.failMount, f.flaky.leave, f.flaky.failUnmount = true, tt.leave, tt.failUnmount
			vol := podVol("u1")
			vol.PVName = "pv1"
			_, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: pvSpec("u1", "pv1", "fd00::5", "/exports/a", []string{"hard"}), Volume: vol})
			if err == nil {
				t.Fatal("SetUp succeeded")
			}
			dir := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~nfs/pv1")
			mountErr := "mount failed: exit status 32\nMounting command: mount\nMounting arguments: -t nfs -o hard [fd00::5]:/exports/a " + dir + "\nOutput: mount.nfs: Connection timed out"
			for _, want := range []string{`nfs volume "data" (PV pv1) (server fd00::5, path /exports/a) for pod ns/pod-u1`, mountErr} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("SetUp error %q does not say %q", err, want)
				}
			}
			if _, cause := volume.EventCause(err); cause != mountErr {
				t.Errorf("event cause = %q, want the mounter's error %q", cause, mountErr)
			}
			if volume.IsUncertain(err) != tt.wantUncertain {
				t.Errorf("uncertain %v, want %v (%v)", volume.IsUncertain(err), tt.wantUncertain, err)
			}
			if got := f.exists("pods/u1/volumes/kubernetes.io~nfs/pv1"); got != tt.wantDir {
				t.Errorf("pod directory left: %v, want %v", got, tt.wantDir)
			}
			if !tt.wantDir && len(f.mounter.MountPoints) != 0 {
				t.Errorf("mounts left: %v", f.mounts())
			}
		})
	}
	t.Run("mount point check fails", func(t *testing.T) {
		f, _ := newFixture(t, false)
		dir := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/data")
		f.mounter.MountCheckErrors = map[string]error{dir: os.ErrPermission}
		_, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: inline("u1", "s", "/e", false), Volume: podVol("u1")})
		if err == nil || !strings.Contains(err.Error(), "checking whether") || len(f.mounter.GetLog()) != 0 {
			t.Errorf("SetUp = %v, mounter calls %v; want the check's error and no mount", err, f.mounter.GetLog())
		}
	})
}
