package step

import (
	"errors"
	"slices"
	"testing"

	"k8s.io/mount-utils"
)

// TestMounter: the hook sees each mount and unmount before it is made, and
// a refusal leaves the mount table as it was; reads go through unseen.
func TestMounter(t *testing.T) {
	refuse := errors.New("no")
	var seen []Step
	var deny bool
	h := Hook(func(s Step) error {
		seen = append(seen, s)
		if deny {
			return refuse
		}
		return nil
	})
	fake := mount.NewFakeMounter(nil)
	m := Mounter(fake, h)
	if err := m.Mount("/dev/a", "/mnt/a", "ext4", nil); err != nil {
		t.Fatal(err)
	}
	if err := m.MountSensitive("/dev/b", "/mnt/b", "ext4", nil, []string{"secret"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.List(); err != nil {
		t.Fatal(err)
	}
	deny = true
	if err := m.Unmount("/mnt/a"); !errors.Is(err, refuse) {
		t.Errorf("Unmount refused by the hook = %v, want its error", err)
	}
	if err := m.MountSensitiveWithoutSystemdWithMountFlags("/dev/c", "/mnt/c", "ext4", nil, nil, nil); !errors.Is(err, refuse) {
		t.Errorf("mount refused by the hook = %v, want its error", err)
	}
	want := []Step{{Mount, "/mnt/a"}, {Mount, "/mnt/b"}, {Unmount, "/mnt/a"}, {Mount, "/mnt/c"}}
	if !slices.Equal(seen, want) {
		t.Errorf("steps seen %v, want %v", seen, want)
	}
	mps, _ := fake.List()
	if len(mps) != 2 {
		t.Errorf("mount table %v, want /mnt/a and /mnt/b still mounted, nothing else", mps)
	}
	if Mounter(fake, nil) != mount.Interface(fake) {
		t.Error("Mounter with no hook wraps the mounter")
	}
}
