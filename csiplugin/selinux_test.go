package csiplugin

import (
	"reflect"
	"testing"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/podvol"
)

// TestWithSELinuxContext: the context comes after the PV's mount options,
// quoted, without changing the spec's options; none for "" or block.
func TestWithSELinuxContext(t *testing.T) {
	const label = "system_u:object_r:container_file_t:s0:c1,c2"
	spec := &podvol.VolumeSpec{Mode: podvol.Filesystem, MountOptions: make([]string, 1, 4)}
	spec.MountOptions[0] = "noatime"
	vc := withSELinuxContext(volumeCapability(spec, csi.Capabilities{}, nil), label)
	if got, want := vc.GetMount().GetMountFlags(), []string{"noatime", `context="` + label + `"`}; !reflect.DeepEqual(got, want) {
		t.Errorf("mount flags %q, want %q", got, want)
	}
	if got := spec.MountOptions[:cap(spec.MountOptions)][1]; got != "" {
		t.Errorf("the spec's mount options were written to: %q", got)
	}
	if got := withSELinuxContext(volumeCapability(spec, csi.Capabilities{}, nil), "").GetMount().GetMountFlags(); !reflect.DeepEqual(got, []string{"noatime"}) {
		t.Errorf("no context: mount flags %q", got)
	}
	block := &podvol.VolumeSpec{Mode: podvol.Block}
	if got := withSELinuxContext(volumeCapability(block, csi.Capabilities{}, nil), label); got.GetBlock() == nil || got.GetMount() != nil {
		t.Errorf("block capability changed: %v", got)
	}
}
