package driver

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// writeData writes data at off into a volume's image.
func (f *fixture) writeData(t *testing.T, id string, off int64, data []byte) {
	t.Helper()
	img, err := os.OpenFile(filepath.Join(f.dir, "state", "volumes", id+".img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := img.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSnapshotAndRestore: a snapshot copies the image's data and keeps its
// holes; a volume restored from it, and a clone of the volume, hold the
// same data; names are idempotent; snapshots list, filter and page.
func TestSnapshotAndRestore(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	vol := f.create(t, "src")
	f.writeData(t, vol, 8<<20, []byte("nodevol snapshot"))

	snap, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	sn := snap.GetSnapshot()
	if sn.GetSourceVolumeId() != vol || !sn.GetReadyToUse() || sn.GetSizeBytes() != defaultVolumeSize || sn.GetCreationTime() == nil {
		t.Errorf("snapshot %v", sn)
	}
	img := filepath.Join(f.dir, "state", "snapshots", sn.GetSnapshotId()+".img")
	if got := allocated(t, img); got > 1<<20 {
		t.Errorf("snapshot image allocates %d bytes of %d: holes not kept", got, defaultVolumeSize)
	}
	again, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vol})
	if err != nil || again.GetSnapshot().GetSnapshotId() != sn.GetSnapshotId() {
		t.Errorf("repeated CreateSnapshot = %v, %v", again, err)
	}
	other := f.create(t, "other")
	_, err = f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: other})
	wantCode(t, "same snapshot name, other source", err, codes.AlreadyExists)

	for _, tc := range []struct {
		name string
		src  *csi.VolumeContentSource
	}{
		{"restored", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sn.GetSnapshotId()}}}},
		{"clone", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}}},
	} {
		resp, err := f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: tc.name, VolumeContentSource: tc.src,
			VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
			CapacityRange:      &csi.CapacityRange{RequiredBytes: 16 << 20}, // smaller than the source: grows to it
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		v := resp.GetVolume()
		if v.GetCapacityBytes() != defaultVolumeSize || v.GetContentSource() == nil {
			t.Errorf("%s: volume %v, want the source's size and content source", tc.name, v)
		}
		data := make([]byte, 16)
		in, err := os.Open(filepath.Join(f.dir, "state", "volumes", v.GetVolumeId()+".img"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = in.ReadAt(data, 8<<20)
		in.Close()
		if string(data) != "nodevol snapshot" {
			t.Errorf("%s: data %q, want the source's", tc.name, data)
		}
	}

	if _, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-2", SourceVolumeId: other}); err != nil {
		t.Fatal(err)
	}
	list, err := f.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: vol})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetSnapshotId() != sn.GetSnapshotId() {
		t.Errorf("ListSnapshots(source %s) = %v, %v", vol, list, err)
	}
	first, err := f.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 1})
	if err != nil || len(first.GetEntries()) != 1 || first.GetNextToken() == "" {
		t.Fatalf("first page %v, %v", first, err)
	}
	second, err := f.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 1, StartingToken: first.GetNextToken()})
	if err != nil || len(second.GetEntries()) != 1 || second.GetNextToken() != "" ||
		second.GetEntries()[0].GetSnapshot().GetSnapshotId() == first.GetEntries()[0].GetSnapshot().GetSnapshotId() {
		t.Errorf("second page %v, %v", second, err)
	}
	if _, err := f.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("snapshot image left: %v", err)
	}
	_, err = f.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: sn.GetSnapshotId()})
	wantCode(t, "GetSnapshot of a deleted snapshot", err, codes.NotFound)
}

func TestSnapshotBadInput(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	vol := f.create(t, "src")
	caps := []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	snapSrc := func(id string) *csi.VolumeContentSource {
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	}
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"snapshot without name", func() error {
			_, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: vol})
			return err
		}, codes.InvalidArgument},
		{"snapshot without source", func() error {
			_, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s"})
			return err
		}, codes.InvalidArgument},
		{"snapshot of ../x", func() error {
			_, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "../x"})
			return err
		}, codes.InvalidArgument},
		{"snapshot of a missing volume", func() error {
			_, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "loop-missing"})
			return err
		}, codes.NotFound},
		{"delete without ID", func() error {
			_, err := f.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{})
			return err
		}, codes.InvalidArgument},
		{"delete of ../x", func() error {
			_, err := f.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "../x"})
			return err
		}, codes.InvalidArgument},
		{"delete of an unknown snapshot", func() error {
			_, err := f.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snap-unknown"})
			return err
		}, codes.OK},
		{"restore from a missing snapshot", func() error {
			_, err := f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: caps, VolumeContentSource: snapSrc("snap-missing")})
			return err
		}, codes.NotFound},
		{"restore from snapshot ID with NUL", func() error {
			_, err := f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: caps, VolumeContentSource: snapSrc("a\x00b")})
			return err
		}, codes.InvalidArgument},
		{"list with a foreign token", func() error {
			_, err := f.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "garbage"})
			return err
		}, codes.Aborted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.name, tt.call(), tt.want) })
	}
	// A restore smaller than its source that cannot grow is OutOfRange.
	snap, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "small", VolumeCapabilities: caps,
		VolumeContentSource: snapSrc(snap.GetSnapshot().GetSnapshotId()), CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20, LimitBytes: 16 << 20}})
	wantCode(t, "restore with limit below the source", err, codes.OutOfRange)
}

// TestSnapshotsSurviveRestart: a new driver on the same state directory
// knows the snapshots; a corrupt snapshot state file fails the start.
func TestSnapshotsSurviveRestart(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	vol := f.create(t, "src")
	snap, err := f.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(f.dir, "state")
	d, err := newServer(options{NodeID: "node-1", StateDir: stateDir, Loop: f.loop, Mounter: f.mounter})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil || got.GetSnapshot().GetSourceVolumeId() != vol {
		t.Errorf("after a restart: %v, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "snapshots", "snap-bad.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newServer(options{NodeID: "node-1", StateDir: stateDir, Loop: f.loop, Mounter: f.mounter}); err == nil {
		t.Error("a corrupt snapshot state file did not fail the start")
	}
}
