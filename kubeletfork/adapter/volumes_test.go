package adapter

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/volume"

	"github.com/nodevol/nodevol/podvol"
	nvolume "github.com/nodevol/nodevol/volume"
)

// stubStats answers GetVolumeStatsFor from a table, and counts calls.
type stubStats struct {
	stats map[string]nvolume.Stats
	err   error
	calls []string
}

func (s *stubStats) GetVolumeStatsFor(_ context.Context, _ types.UID, name string) (nvolume.Stats, bool, error) {
	s.calls = append(s.calls, name)
	st, ok := s.stats[name]
	return st, ok, s.err
}

// TestVolumeMap checks what the kubelet reads of each kind of mounted
// volume: mounter or block mapper, path, attributes, SELinux label.
func TestVolumeMap(t *testing.T) {
	const podDir = "/var/lib/kubelet/pods/uid-1"
	vols := []podvol.MountedVolume{
		{SpecName: "data", DirName: "pv-1", Plugin: "kubernetes.io/csi", Path: podDir + "/volumes/kubernetes.io~csi/pv-1/mount", SELinuxContext: "system_u:object_r:container_file_t:s0:c1,c2"},
		{SpecName: "dev", DirName: "pv-2", Plugin: "kubernetes.io/csi", Block: true, Path: podDir + "/volumeDevices/kubernetes.io~csi/pv-2"},
		{SpecName: "cfg", DirName: "cfg", Plugin: "kubernetes.io/configmap", ReadOnly: true, Path: podDir + "/volumes/kubernetes.io~configmap/cfg"},
		{SpecName: "host", DirName: "host", Plugin: hostPathPlugin, Path: "/srv/data"},
		{SpecName: "img", DirName: "img", Plugin: "kubernetes.io/image", ProvidedByRuntime: true, ReadOnly: true},
		{SpecName: "share", DirName: "pv-3", Plugin: nfsPlugin, ReadOnly: true, Path: podDir + "/volumes/kubernetes.io~nfs/pv-3"},
	}
	got := volumeMap(&stubStats{}, "uid-1", vols)
	for _, tc := range []struct {
		name, path, inner string
		block, labeled    bool
		attrs             volume.Attributes
	}{
		{name: "data", path: vols[0].Path, inner: "pv-1", labeled: true, attrs: volume.Attributes{Managed: true}},
		{name: "dev", path: vols[1].Path, inner: "pv-2", block: true},
		{name: "cfg", path: vols[2].Path, inner: "cfg", attrs: volume.Attributes{ReadOnly: true, Managed: true, SELinuxRelabel: true}},
		{name: "host", path: "/srv/data", inner: "host", attrs: volume.Attributes{}},
		{name: "img", path: "", inner: "img", attrs: volume.Attributes{ReadOnly: true, Managed: true}},
		// As the kubelet's nfs mounter: neither managed nor relabelled.
		{name: "share", path: vols[5].Path, inner: "pv-3", attrs: volume.Attributes{ReadOnly: true}},
	} {
		info, ok := got[tc.name]
		if !ok {
			t.Errorf("%s: missing from %v", tc.name, got)
			continue
		}
		if info.InnerVolumeSpecName != tc.inner || info.SELinuxLabeled != tc.labeled {
			t.Errorf("%s: %+v", tc.name, info)
		}
		if tc.block {
			if info.Mounter != nil || info.BlockVolumeMapper == nil {
				t.Fatalf("%s: a block volume needs a mapper and no mounter: %+v", tc.name, info)
			}
			dir, name := info.BlockVolumeMapper.GetPodDeviceMapPath()
			if dir != podDir+"/volumeDevices/kubernetes.io~csi" || name != "pv-2" {
				t.Errorf("%s: device map path %q %q", tc.name, dir, name)
			}
			continue
		}
		if info.Mounter == nil || info.BlockVolumeMapper != nil {
			t.Fatalf("%s: a filesystem volume needs a mounter and no mapper: %+v", tc.name, info)
		}
		if info.Mounter.GetPath() != tc.path {
			t.Errorf("%s: path %q, want %q", tc.name, info.Mounter.GetPath(), tc.path)
		}
		if a := info.Mounter.GetAttributes(); a != tc.attrs {
			t.Errorf("%s: attributes %+v, want %+v", tc.name, a, tc.attrs)
		}
		if err := info.Mounter.SetUp(volume.MounterArgs{}); !errors.Is(err, errNotSetUpHere) {
			t.Errorf("%s: SetUp = %v, want a refusal", tc.name, err)
		}
	}
}

// TestGetMetrics checks the usage handed to the kubelet's stats: counts
// as quantities (one not reported is 0), a volume without usage not
// supported, an error passed on; one volume asked at a time.
func TestGetMetrics(t *testing.T) {
	stats := &stubStats{stats: map[string]nvolume.Stats{
		"data": {CapacityBytes: 1 << 30, AvailableBytes: 1 << 29, UsedBytes: 1 << 29, Inodes: 1000, InodesFree: 900, InodesUsed: -1},
	}}
	vm := volumeMap(stats, "uid-1", []podvol.MountedVolume{{SpecName: "data"}, {SpecName: "img", ProvidedByRuntime: true}})
	m, err := vm["data"].Mounter.GetMetrics()
	if err != nil {
		t.Fatal(err)
	}
	if m.Capacity.Value() != 1<<30 || m.Available.Value() != 1<<29 || m.Used.Value() != 1<<29 ||
		m.Inodes.Value() != 1000 || m.InodesFree.Value() != 900 || m.InodesUsed.Value() != 0 {
		t.Errorf("metrics %+v", m)
	}
	if _, err := vm["img"].Mounter.GetMetrics(); !volume.IsNotSupported(err) {
		t.Errorf("metrics of a volume without usage: %v, want not supported", err)
	}
	if len(stats.calls) != 2 || stats.calls[0] != "data" || stats.calls[1] != "img" {
		t.Errorf("stats asked for %v, want each volume once", stats.calls)
	}
	stats.err = errors.New("NodeGetVolumeStats: unavailable")
	if _, err := vm["data"].Mounter.GetMetrics(); !errors.Is(err, stats.err) {
		t.Errorf("metrics when the driver fails: %v", err)
	}
}
