package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// script makes the fixture's exec answer each command in turn (blkid,
// fsck, mkfs) with an error, or an output (a string), and records the
// command lines.
func (f *fixture) script(cmds *[]string, answers ...any) {
	for _, a := range answers {
		f.exec.CommandScript = append(f.exec.CommandScript, func(cmd string, args ...string) exec.Cmd {
			*cmds = append(*cmds, strings.Join(append([]string{cmd}, args...), " "))
			out, _ := a.(string)
			err, _ := a.(error)
			return &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{func() ([]byte, []byte, error) { return []byte(out), nil, err }}}
		})
	}
}

// TestBlockDeviceFilesystem: a block device is formatted once and mounted
// at the kubelet's device mount path, pods bind-mount it from there, and
// it is unmounted only once no pod mount references it.
func TestBlockDeviceFilesystem(t *testing.T) {
	f := newFixture(t)
	var cmds []string
	f.script(&cmds, testingexec.FakeExitError{Status: 2}, nil) // blkid: no filesystem; mkfs
	ctx := context.Background()
	s := spec("pv1", f.dev, podvol.Filesystem)
	s.MountOptions = []string{"noatime"}
	vol := podVol("u1")
	if _, err := f.p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: vol}); !errors.Is(err, volume.ErrNotReady) {
		t.Fatalf("SetUp before MountDevice = %v, want ErrNotReady", err)
	}
	dmp, err := f.p.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: vol})
	if want := filepath.Join(f.root, "plugins/kubernetes.io/local-volume/mounts/pv1"); err != nil || dmp != want {
		t.Fatalf("MountDevice = %q, %v; want %q", dmp, err, want)
	}
	if want := []string{"blkid -p -s TYPE -s PTTYPE -o export " + f.dev, "mkfs.ext4 -F -m0 " + f.dev}; !cmp.Equal(want, cmds) {
		t.Errorf("commands = %q, want %q", cmds, want)
	}
	if again, err := f.p.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: vol}); err != nil || again != dmp || len(cmds) != 2 {
		t.Errorf("second MountDevice = %q, %v (commands %q): want the same path and nothing run", again, err, cmds)
	}
	path, err := f.p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: vol, DeviceMountPath: dmp})
	if err != nil {
		t.Fatal(err)
	}
	// The fake mounter records a bind mount with the device of its source.
	want := []string{
		f.dev + " -> plugins/kubernetes.io/local-volume/mounts/pv1 [noatime defaults]",
		f.dev + " -> pods/u1/volumes/kubernetes.io~local-volume/pv1 [bind noatime]",
	}
	if diff := cmp.Diff(want, f.mounts()); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	found := foundSpec("pv1", podvol.Filesystem)
	var inUse *volume.InUseError
	if err := f.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &found}); !errors.As(err, &inUse) || len(inUse.Refs) != 1 || inUse.Refs[0] != path {
		t.Fatalf("UnmountDevice under a pod mount = %v, want an InUseError naming %s", err, path)
	}
	if err := f.p.TearDown(ctx, volume.MountRequest{Spec: &found, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := f.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &found}); err != nil {
			t.Fatalf("UnmountDevice %d: %v", i, err)
		}
	}
	if len(f.mounter.MountPoints) != 0 || f.exists("plugins/kubernetes.io/local-volume/mounts/pv1") {
		t.Errorf("left: mounts %v, device mount directory %v", f.mounts(), f.exists("plugins/kubernetes.io/local-volume/mounts/pv1"))
	}
}

// TestMountDevice: what is staged for each kind of path, and a failed
// format or mount takes back the directory.
func TestMountDevice(t *testing.T) {
	xfs := "xfs"
	tests := []struct {
		name     string
		path     func(f *fixture) string
		mode     podvol.VolumeMode
		fsType   *string
		readOnly bool
		answers  []any
		wantCmds []string
		wantPath bool
		wantErr  string
	}{
		{name: "directory: nothing staged", path: func(f *fixture) string { return f.dir }},
		{name: "Block: nothing staged", mode: podvol.Block},
		{name: "fsType of the PV", fsType: &xfs, answers: []any{testingexec.FakeExitError{Status: 2}, nil},
			wantCmds: []string{"blkid", "mkfs.xfs"}, wantPath: true},
		{name: "formatted already: checked, not formatted", answers: []any{"TYPE=ext4\n", nil}, wantCmds: []string{"blkid", "fsck"}, wantPath: true},
		{name: "unformatted read-only: refused", readOnly: true, answers: []any{testingexec.FakeExitError{Status: 2}},
			wantCmds: []string{"blkid"}, wantErr: "unformatted"},
		{name: "mkfs fails", answers: []any{testingexec.FakeExitError{Status: 2}, errors.New("no space")},
			wantCmds: []string{"blkid", "mkfs.ext4"}, wantErr: "format"},
		{name: "missing device", path: func(f *fixture) string { return f.dev + "-gone" }, wantErr: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			var cmds []string
			f.script(&cmds, tt.answers...)
			path := f.dev
			if tt.path != nil {
				path = tt.path(f)
			}
			mode := tt.mode
			if mode == "" {
				mode = podvol.Filesystem
			}
			s := spec("pv1", path, mode)
			s.PVSource.Local.FSType, s.ReadOnly = tt.fsType, tt.readOnly
			got, err := f.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: s})
			for i := range cmds {
				cmds[i], _, _ = strings.Cut(cmds[i], " ")
			}
			if !cmp.Equal(tt.wantCmds, cmds, cmpEmpty) {
				t.Errorf("commands = %q, want %q", cmds, tt.wantCmds)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || volume.IsUncertain(err) {
					t.Errorf("MountDevice error = %v, want a final one with %q", err, tt.wantErr)
				}
				if f.exists("plugins/kubernetes.io/local-volume/mounts/pv1") {
					t.Error("a failed MountDevice left its directory")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got != "") != tt.wantPath || (got == "") != (len(f.mounter.MountPoints) == 0) {
				t.Errorf("MountDevice = %q with mounts %v", got, f.mounts())
			}
		})
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 || cmp.Equal(a, b) })

// TestFSGroup: the first pod to mount the volume gives its fsGroup
// ownership; a second pod with another group changes nothing and gets the
// kubelet's warning.
func TestFSGroup(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gid := int64(os.Getegid())
	s := spec("pv1", f.dir, podvol.Filesystem)
	first := podVol("u1")
	first.FSGroup = &gid
	path, err := f.p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: first, ChangeOwnership: true})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSetgid == 0 {
		t.Errorf("first pod's mount: %v, mode %v: want the setgid bit of the fsGroup walk", err, fi.Mode())
	}
	other := gid + 1
	second := podVol("u2")
	second.FSGroup = &other
	path2, err := f.p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: second, ChangeOwnership: true})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path2); err != nil || fi.Mode()&os.ModeSetgid != 0 {
		t.Errorf("second pod's mount: %v, mode %v: want no ownership change", err, fi.Mode())
	}
	select {
	case ev := <-f.events.Events:
		if !strings.HasPrefix(ev, "Warning AlreadyMountedVolume The requested fsGroup is") {
			t.Errorf("event = %q", ev)
		}
	default:
		t.Error("no warning for the second pod's other fsGroup")
	}
}
