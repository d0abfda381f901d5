package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestSetUpDirectory: a directory PV is bind-mounted into the pod with
// the kubelet's options; a bad or missing path is refused before anything
// is made; TearDown unmounts and removes the directory, twice over.
func TestSetUpDirectory(t *testing.T) {
	tests := []struct {
		name     string
		path     func(f *fixture) string
		readOnly bool // the pod's claim
		specRO   bool
		options  []string
		want     []string // the mount table after SetUp; nil: SetUp fails
		wantErr  string
	}{
		{name: "directory", want: []string{"{dir} -> pods/u1/volumes/kubernetes.io~local-volume/pv1 [bind]"}},
		{name: "read-only claim", readOnly: true, want: []string{"{dir} -> pods/u1/volumes/kubernetes.io~local-volume/pv1 [bind ro]"}},
		{name: "read-only spec and mount options", specRO: true, options: []string{"noatime"},
			want: []string{"{dir} -> pods/u1/volumes/kubernetes.io~local-volume/pv1 [bind ro noatime]"}},
		{name: "missing path", path: func(f *fixture) string { return f.dir + "-gone" }, wantErr: "no such file or directory"},
		{name: "relative path", path: func(*fixture) string { return "vol" }, wantErr: "is not absolute"},
		{name: "path with ..", path: func(f *fixture) string { return f.dir + "/../vol" }, wantErr: "must not contain '..'"},
		{name: "regular file", path: func(f *fixture) string { return f.dev + "-file" }, wantErr: "only a directory or a block device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			if err := os.WriteFile(f.dev+"-file", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			path := f.dir
			if tt.path != nil {
				path = tt.path(f)
			}
			s := spec("pv1", path, podvol.Filesystem)
			s.ReadOnly, s.MountOptions = tt.specRO, tt.options
			vol := podVol("u1")
			vol.ReadOnly = tt.readOnly
			got, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: s, Volume: vol})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "pod ns/pod-u1") {
					t.Fatalf("SetUp error = %v, want one naming the pod and %q", err, tt.wantErr)
				}
				if f.exists("pods") || len(f.mounter.MountPoints) != 0 {
					t.Errorf("a refused SetUp made something: pods/ exists %v, mounts %v", f.exists("pods"), f.mounts())
				}
				return
			}
			if err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			want := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~local-volume/pv1")
			if got != want {
				t.Errorf("SetUp = %q, want %q", got, want)
			}
			if diff := cmp.Diff(f.subst(tt.want), f.mounts()); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			// Idempotent: no second mount.
			if _, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: s, Volume: vol}); err != nil || len(f.mounter.MountPoints) != 1 {
				t.Errorf("second SetUp: %v, mounts %v", err, f.mounts())
			}
			// TearDown from the path alone: no source.
			found := foundSpec("pv1", podvol.Filesystem)
			for i := range 2 {
				if err := f.p.TearDown(context.Background(), volume.MountRequest{Spec: &found, Volume: vol}); err != nil {
					t.Fatalf("TearDown %d: %v", i, err)
				}
			}
			if len(f.mounter.MountPoints) != 0 || f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1") {
				t.Errorf("after TearDown: mounts %v, directory left %v", f.mounts(), f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1"))
			}
			if _, err := os.Stat(f.dir); err != nil {
				t.Errorf("the PV's directory: %v", err)
			}
		})
	}
}

func (f *fixture) subst(want []string) []string {
	out := make([]string, len(want))
	for i, w := range want {
		out[i] = strings.ReplaceAll(w, "{dir}", f.dir)
	}
	return out
}

// TestSetUpSteps: every change SetUp and TearDown make is announced.
func TestSetUpSteps(t *testing.T) {
	f := newFixture(t)
	s, vol := spec("pv1", f.dir, podvol.Filesystem), podVol("u1")
	if _, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: s, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if err := f.p.TearDown(context.Background(), volume.MountRequest{Spec: s, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mkdir pods", "mkdir pods/u1", "mkdir pods/u1/volumes", "mkdir pods/u1/volumes/kubernetes.io~local-volume",
		"mkdir pods/u1/volumes/kubernetes.io~local-volume/pv1", "mount pods/u1/volumes/kubernetes.io~local-volume/pv1",
		"unmount pods/u1/volumes/kubernetes.io~local-volume/pv1", "remove pods/u1/volumes/kubernetes.io~local-volume/pv1",
	}
	if diff := cmp.Diff(want, f.steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
}

// TestSetUpFailures: a mount that fails is taken back (Uncertain only if
// it may remain); an unmount that fails is Uncertain and keeps the
// directory.
func TestSetUpFailures(t *testing.T) {
	tests := []struct {
		name          string
		failMount     bool
		leave         bool
		failUnmount   bool
		wantUncertain bool
		wantDir       bool
	}{
		{name: "mount fails", failMount: true},
		{name: "mount fails and leaves a mount, taken back", failMount: true, leave: true},
		{name: "mount fails and leaves a mount that cannot be unmounted", failMount: true, leave: true, failUnmount: true, wantUncertain: true, wantDir: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.failMounts(tt.failMount, tt.leave, tt.failUnmount)
			_, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: spec("pv1", f.dir, podvol.Filesystem), Volume: podVol("u1")})
			if err == nil {
				t.Fatal("SetUp succeeded")
			}
			if volume.IsUncertain(err) != tt.wantUncertain {
				t.Errorf("SetUp error %v: uncertain %v, want %v", err, volume.IsUncertain(err), tt.wantUncertain)
			}
			if got := f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1"); got != tt.wantDir {
				t.Errorf("pod directory left: %v, want %v", got, tt.wantDir)
			}
		})
	}
	t.Run("unmount fails", func(t *testing.T) {
		f := newFixture(t)
		s, vol := spec("pv1", f.dir, podvol.Filesystem), podVol("u1")
		if _, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: s, Volume: vol}); err != nil {
			t.Fatal(err)
		}
		f.failMounts(false, false, true)
		err := f.p.TearDown(context.Background(), volume.MountRequest{Spec: s, Volume: vol})
		if !volume.IsUncertain(err) || !f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1") {
			t.Errorf("TearDown = %v (uncertain %v), directory left %v; want Uncertain and the directory kept", err, volume.IsUncertain(err), f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1"))
		}
	})
	t.Run("not empty, not a mount point", func(t *testing.T) {
		f := newFixture(t)
		dir := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~local-volume/pv1")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := foundSpec("pv1", podvol.Filesystem)
		if err := f.p.TearDown(context.Background(), volume.MountRequest{Spec: &s, Volume: podVol("u1")}); err == nil {
			t.Error("TearDown removed a directory with data in it")
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); err != nil {
			t.Errorf("the data: %v", err)
		}
	})
	t.Run("symlink as the pod directory", func(t *testing.T) {
		f := newFixture(t)
		base := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~local-volume")
		if err := os.MkdirAll(base, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(f.dir, filepath.Join(base, "pv1")); err != nil {
			t.Fatal(err)
		}
		_, err := f.p.SetUp(context.Background(), volume.MountRequest{Spec: spec("pv1", f.dir, podvol.Filesystem), Volume: podVol("u1")})
		if err == nil || len(f.mounter.MountPoints) != 0 {
			t.Errorf("SetUp through a symlink: %v, mounts %v", err, f.mounts())
		}
	})
}
