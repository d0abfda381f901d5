package nfs

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// foundReq is the request TearDown gets for a volume found on disk: no
// source, the directory's name as the pod volume's.
func foundReq(uid, name string) volume.MountRequest {
	vol := podVol(uid)
	vol.SpecName = name
	return volume.MountRequest{Spec: &podvol.VolumeSpec{Name: volumeName(vol.Pod.UID, name), Plugin: PluginName, Ephemeral: true}, Volume: vol}
}

// TestTearDownForces: with a mounter that can force an unmount, TearDown
// uses it with the kubelet's minute; a failed SetUp's clean-up does not.
func TestTearDownForces(t *testing.T) {
	f, fm := newFixture(t, true)
	req := volume.MountRequest{Spec: inline("u1", "s", "/e", false), Volume: podVol("u1")}
	if _, err := f.p.SetUp(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if err := f.p.TearDown(context.Background(), foundReq("u1", "data")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]time.Duration{time.Minute}, fm.timeouts); diff != "" {
		t.Errorf("forced unmount timeouts (-want +got):\n%s", diff)
	}
	if len(f.mounter.MountPoints) != 0 || f.exists("pods/u1/volumes/kubernetes.io~nfs/data") {
		t.Errorf("after TearDown: mounts %v, directory left %v", f.mounts(), f.exists("pods/u1/volumes/kubernetes.io~nfs/data"))
	}
	if diff := cmp.Diff([]string{"unmount pods/u1/volumes/kubernetes.io~nfs/data"}, stepsOf(f.steps, "unmount")); diff != "" {
		t.Errorf("forced unmount not announced (-want +got):\n%s", diff)
	}

	f.flaky.failMount, f.flaky.leave = true, true
	fm.timeouts = nil
	if _, err := f.p.SetUp(context.Background(), req); err == nil {
		t.Fatal("SetUp succeeded")
	}
	if len(fm.timeouts) != 0 || len(f.mounter.MountPoints) != 0 {
		t.Errorf("a failed mount's clean-up: forced unmounts %v, mounts left %v; want a plain unmount", fm.timeouts, f.mounts())
	}
}

func stepsOf(steps []string, op string) []string {
	var out []string
	for _, s := range steps {
		if strings.HasPrefix(s, op+" ") {
			out = append(out, s)
		}
	}
	return out
}

// TestTearDown: what TearDown does with each state of the pod's directory.
func TestTearDown(t *testing.T) {
	const rel = "pods/u1/volumes/kubernetes.io~nfs/data"
	tests := []struct {
		name          string
		prepare       func(t *testing.T, f *fixture)
		wantErr       string // "" for success
		wantUncertain bool
		wantLeft      bool // the directory (or what is there) stays
		wantUnmounts  int
	}{
		{name: "missing", prepare: func(*testing.T, *fixture) {}},
		{name: "empty directory, not a mount point", prepare: func(t *testing.T, f *fixture) { f.mkdir(t, rel) }},
		{name: "mounted", prepare: func(t *testing.T, f *fixture) {
			if err := f.mounter.Mount("s:/e", f.mkdir(t, rel), "nfs", nil); err != nil {
				t.Fatal(err)
			}
		}, wantUnmounts: 1},
		{name: "server gone (ESTALE): unmounted without the check", prepare: func(t *testing.T, f *fixture) {
			dir := f.mkdir(t, rel)
			if err := f.mounter.Mount("s:/e", dir, "nfs", nil); err != nil {
				t.Fatal(err)
			}
			stale := true
			f.mounter.UnmountFunc = func(string) error { stale = false; return nil }
			lstat := f.p.lstat
			f.p.lstat = func(name string) (fs.FileInfo, error) {
				if name == dir && stale {
					return nil, &fs.PathError{Op: "lstat", Path: name, Err: unix.ESTALE}
				}
				return lstat(name)
			}
			// The mount point check would fail as well.
			f.mounter.MountCheckErrors = map[string]error{dir: &fs.PathError{Op: "statx", Path: dir, Err: unix.ESTALE}}
		}, wantUnmounts: 1},
		{name: "not empty, not a mount point: the data stays", prepare: func(t *testing.T, f *fixture) {
			if err := os.WriteFile(filepath.Join(f.mkdir(t, rel), "data"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "directory not empty", wantLeft: true},
		{name: "unmount fails: Uncertain, kept", prepare: func(t *testing.T, f *fixture) {
			if err := f.mounter.Mount("s:/e", f.mkdir(t, rel), "nfs", nil); err != nil {
				t.Fatal(err)
			}
			f.flaky.failUnmount = true
		}, wantErr: "umount: device is busy", wantUncertain: true, wantLeft: true},
		{name: "still mounted after the unmount: Uncertain, kept", prepare: func(t *testing.T, f *fixture) {
			dir := f.mkdir(t, rel)
			for range 2 {
				if err := f.mounter.Mount("s:/e", dir, "nfs", nil); err != nil {
					t.Fatal(err)
				}
			}
			// The fake unmounts every mount at a path: keep one back.
			f.mounter.UnmountFunc = func(string) error { return nil }
			f.flaky.failUnmount = false
			f.mounter.MountCheckErrors = nil
			f.p.mounter = stuckMounter{f.flaky}
		}, wantErr: "failed to cleanup mount point", wantUncertain: true, wantLeft: true, wantUnmounts: 1},
		{name: "mount point check fails: Uncertain, kept", prepare: func(t *testing.T, f *fixture) {
			dir := f.mkdir(t, rel)
			f.mounter.MountCheckErrors = map[string]error{dir: &fs.PathError{Op: "statx", Path: dir, Err: unix.EPERM}}
		}, wantErr: "checking whether", wantUncertain: true, wantLeft: true},
		{name: "a symlink is left alone", prepare: func(t *testing.T, f *fixture) {
			f.mkdir(t, filepath.Dir(rel))
			if err := os.Symlink(t.TempDir(), filepath.Join(f.root, rel)); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "not a directory", wantLeft: true},
		{name: "a file is left alone", prepare: func(t *testing.T, f *fixture) {
			f.mkdir(t, filepath.Dir(rel))
			if err := os.WriteFile(filepath.Join(f.root, rel), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "not a directory", wantLeft: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := newFixture(t, false)
			tt.prepare(t, f)
			f.mounter.ResetLog()
			err := f.p.TearDown(context.Background(), foundReq("u1", "data"))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("TearDown: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "pod ns/pod-u1")):
				t.Fatalf("TearDown = %v, want an error naming the pod and %q", err, tt.wantErr)
			}
			if volume.IsUncertain(err) != tt.wantUncertain {
				t.Errorf("uncertain %v, want %v (%v)", volume.IsUncertain(err), tt.wantUncertain, err)
			}
			if got := f.exists(rel); got != tt.wantLeft {
				t.Errorf("directory left: %v, want %v", got, tt.wantLeft)
			}
			if got := len(f.mounter.GetLog()); got != tt.wantUnmounts {
				t.Errorf("unmounts: %v, want %d", f.mounter.GetLog(), tt.wantUnmounts)
			}
		})
	}
}

// stuckMounter reports its path still mounted after an unmount.
type stuckMounter struct{ *flakyMounter }

func (m stuckMounter) IsMountPoint(string) (bool, error) { return true, nil }

// TestCorruptedErrors: the errors of a mount whose server is gone, as the
// kubelet's IsCorruptedMnt lists them, wherever they are in the chain.
func TestCorruptedErrors(t *testing.T) {
	for _, errno := range []syscall.Errno{unix.ESTALE, unix.ENOTCONN, unix.EIO, unix.EACCES, unix.EHOSTDOWN, unix.EWOULDBLOCK, unix.ENODEV} {
		if !corrupted(&fs.PathError{Op: "lstat", Path: "/x", Err: errno}) {
			t.Errorf("corrupted(%v) = false", errno)
		}
	}
	for _, err := range []error{nil, unix.ENOENT, unix.EPERM, &fs.PathError{Op: "lstat", Path: "/x", Err: unix.ENOTDIR}} {
		if corrupted(err) {
			t.Errorf("corrupted(%v) = true", err)
		}
	}
}
