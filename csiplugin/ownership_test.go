package csiplugin

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

func TestNeedsOwnership(t *testing.T) {
	gid := int64(2000)
	policy := func(p storagev1.FSGroupPolicy) *storagev1.CSIDriver {
		return csitest.CSIDriver(drv, false, csitest.DriverFSGroupPolicy(p))
	}
	rwo := cache.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteOnce"}
	tests := []struct {
		name   string
		spec   cache.VolumeSpec
		vol    cache.PodVolume
		caps   Capabilities
		driver *storagev1.CSIDriver
		want   bool
	}{
		{name: "no fsGroup", spec: rwo},
		{name: "RWO with fsType, no CSIDriver", spec: rwo, vol: cache.PodVolume{FSGroup: &gid}, want: true},
		{name: "default policy", spec: rwo, vol: cache.PodVolume{FSGroup: &gid}, driver: csitest.CSIDriver(drv, false), want: true},
		{name: "driver applies it (VOLUME_MOUNT_GROUP)", spec: rwo, vol: cache.PodVolume{FSGroup: &gid}, caps: Capabilities{VolumeMountGroup: true}},
		{name: "read-only pod volume", spec: rwo, vol: cache.PodVolume{FSGroup: &gid, ReadOnly: true}},
		{name: "read-only PV", spec: cache.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteOnce", ReadOnly: true}, vol: cache.PodVolume{FSGroup: &gid}},
		{name: "no fsType", spec: cache.VolumeSpec{AccessMode: "ReadWriteOnce"}, vol: cache.PodVolume{FSGroup: &gid}},
		{name: "RWX", spec: cache.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteMany"}, vol: cache.PodVolume{FSGroup: &gid}},
		{name: "RWX with File policy", spec: cache.VolumeSpec{AccessMode: "ReadWriteMany"}, vol: cache.PodVolume{FSGroup: &gid}, driver: policy(storagev1.FileFSGroupPolicy), want: true},
		{name: "None policy", spec: rwo, vol: cache.PodVolume{FSGroup: &gid}, driver: policy(storagev1.NoneFSGroupPolicy)},
		{name: "RWO second of the PV's modes", spec: cache.VolumeSpec{FSType: "ext4", AccessMode: "ReadOnlyMany", ReadWriteOnce: true}, vol: cache.PodVolume{FSGroup: &gid}, want: true},
		{name: "PV without access modes", spec: cache.VolumeSpec{FSType: "ext4"}, vol: cache.PodVolume{FSGroup: &gid}},
		{name: "inline with fsType", spec: cache.VolumeSpec{FSType: "ext4", Ephemeral: true}, vol: cache.PodVolume{FSGroup: &gid}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := needsOwnership(&tt.spec, tt.vol, tt.caps, tt.driver); got != tt.want {
				t.Errorf("needsOwnership = %v, want %v", got, tt.want)
			}
		})
	}
}

// tree makes dir/{a, sub/b, link -> outside} and returns the outside file.
func tree(t *testing.T, dir string) string {
	t.Helper()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, f := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "sub", "b"), outside} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return outside
}

func modeAndGid(t *testing.T, path string) (fs.FileMode, int64) {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode(), int64(info.Sys().(*syscall.Stat_t).Gid)
}

// TestSetOwnership: every file and directory gets the group, group
// read-write and (directories) setgid; a symlink's target outside the
// volume keeps its mode; with OnRootMismatch a root that already has it all
// stops the walk. The group itself can only be checked as root.
func TestSetOwnership(t *testing.T) {
	gid := int64(os.Getgid())
	if os.Geteuid() == 0 {
		gid = 2000
	}
	dir := filepath.Join(t.TempDir(), "mount")
	outside := tree(t, dir)
	if err := setOwnership(context.Background(), dir, gid, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want fs.FileMode
	}{
		{dir, fs.ModeDir | fs.ModeSetgid | 0o770},
		{filepath.Join(dir, "sub"), fs.ModeDir | fs.ModeSetgid | 0o770},
		{filepath.Join(dir, "a"), 0o660},
		{filepath.Join(dir, "sub", "b"), 0o660},
		{outside, 0o600},
	} {
		mode, g := modeAndGid(t, tc.path)
		if mode != tc.want {
			t.Errorf("%s: mode %v, want %v", tc.path, mode, tc.want)
		}
		if tc.path != outside && g != gid {
			t.Errorf("%s: group %d, want %d", tc.path, g, gid)
		}
	}

	// The root has it all: OnRootMismatch does not look further.
	newFile := filepath.Join(dir, "new")
	if err := os.WriteFile(newFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := setOwnership(context.Background(), dir, gid, true); err != nil {
		t.Fatal(err)
	}
	if mode, _ := modeAndGid(t, newFile); mode != 0o600 {
		t.Errorf("OnRootMismatch with a matching root changed %s to %v", newFile, mode)
	}
	// Always (the default) walks again.
	if err := setOwnership(context.Background(), dir, gid, false); err != nil {
		t.Fatal(err)
	}
	if mode, _ := modeAndGid(t, newFile); mode != 0o660 {
		t.Errorf("Always left %s at %v", newFile, mode)
	}
}

func TestWalkChildrenFirst(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mount")
	tree(t, dir)
	var order []string
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := walkChildrenFirst(context.Background(), d, func(p string, _ int, _ fs.FileInfo) { order = append(order, p) }); err != nil {
		t.Fatal(err)
	}
	pos := func(p string) int { return slices.Index(order, filepath.Join(dir, p)) }
	if len(order) != 5 || pos("") != 4 || pos("sub/b") > pos("sub") || pos("sub") < 0 || pos("link") < 0 {
		t.Errorf("walk order %v: want every entry once, each directory after its entries, the root last", order)
	}
}

// TestSetUpAppliesFSGroup: a driver without VOLUME_MOUNT_GROUP gets its
// published volume owned by nodevol; one with it gets the group in the
// request and nodevol leaves the files alone.
func TestSetUpAppliesFSGroup(t *testing.T) {
	gid := int64(os.Getgid())
	for _, mountGroup := range []bool{false, true} {
		e := newEnv(t, envOptions{
			objects: []runtime.Object{csitest.CSIDriver(drv, false)},
			driver:  csitest.Options{NoStageUnstage: true, CreateTargetDirs: true, VolumeMountGroup: mountGroup},
		})
		vol := podVolume("a", "data")
		vol.FSGroup = &gid
		path, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: vol})
		if err != nil {
			t.Fatal(err)
		}
		mode, _ := modeAndGid(t, path)
		req := e.request(t, "NodePublishVolume").(*csi.NodePublishVolumeRequest)
		passed := req.GetVolumeCapability().GetMount().GetVolumeMountGroup()
		if mountGroup {
			if mode&fs.ModeSetgid != 0 || passed == "" {
				t.Errorf("VOLUME_MOUNT_GROUP: mode %v (want untouched), volume_mount_group %q (want %d)", mode, passed, gid)
			}
		} else if mode&fs.ModeSetgid == 0 || mode.Perm()&0o770 != 0o770 || passed != "" {
			t.Errorf("no VOLUME_MOUNT_GROUP: mode %v (want setgid, group rwx), volume_mount_group %q (want none)", mode, passed)
		}
	}
}
