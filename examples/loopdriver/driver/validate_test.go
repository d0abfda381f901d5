package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want codes.Code
	}{
		{"loop-0123", codes.OK},
		{"", codes.InvalidArgument},
		{".", codes.InvalidArgument},
		{"..", codes.InvalidArgument},
		{"../etc", codes.InvalidArgument},
		{"a/b", codes.InvalidArgument},
		{"a\x00b", codes.InvalidArgument},
		{strings.Repeat("x", 254), codes.InvalidArgument},
	} {
		if got := status.Code(validateID(tc.id)); got != tc.want {
			t.Errorf("validateID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
	if err := validateID(""); !strings.Contains(err.Error(), "volume_id") {
		t.Errorf("error %q does not name the field", err)
	}
}

func TestValidatePath(t *testing.T) {
	d := &server{stateDir: "/var/lib/loop"}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/var/lib/kubelet/pods/x/mount", true},
		{"/var/lib/loopy", true},
		{"", false},
		{"relative/path", false},
		{"/a/../b", false},
		{"/a//b", false},
		{"/a/b/", false},
		{"/", false},
		{"/var/lib/loop", false},
		{"/var/lib/loop/volumes/x.img", false},
		{"/a\x00b", false},
	} {
		err := d.validatePath("target_path", tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("validatePath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
		if err != nil && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "target_path")) {
			t.Errorf("validatePath(%q) = %v, want InvalidArgument naming target_path", tc.path, err)
		}
	}
}

func mountCap(fs string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func TestCheckCapability(t *testing.T) {
	const snw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	for _, tc := range []struct {
		name string
		cap  *csi.VolumeCapability
		want accessKind
	}{
		{"mount default fs", mountCap("", snw), accessMount},
		{"block", blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), accessBlock},
		{"nil", nil, 0},
		{"no access type", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}, 0},
		{"no access mode", &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}, 0},
		{"multi node", mountCap("", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), 0},
		{"unknown fs", mountCap("zfs", snw), 0},
	} {
		got, err := checkCapability("volume_capability", tc.cap)
		if got != tc.want || (err == nil) != (tc.want != 0) {
			t.Errorf("%s: checkCapability = %v, %v; want %v", tc.name, got, err, tc.want)
		}
		if err != nil && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "volume_capability")) {
			t.Errorf("%s: %v, want InvalidArgument naming the field", tc.name, err)
		}
	}
}

func TestPickSize(t *testing.T) {
	for _, tc := range []struct {
		req, lim int64
		want     int64 // 0: OutOfRange
	}{
		{0, 0, defaultVolumeSize},
		{1, 0, minVolumeSize},
		{100 << 20, 0, 100 << 20},
		{100<<20 + 1, 0, 100<<20 + sizeAlign},
		{0, 32 << 20, 32 << 20},
		{0, 8 << 20, 0},
		{20 << 20, 10 << 20, 0},
		{100<<20 + 1, 100<<20 + 2, 0},
		{-1, 0, 0},
	} {
		got, err := pickSize(&csi.CapacityRange{RequiredBytes: tc.req, LimitBytes: tc.lim})
		if tc.want == 0 {
			if status.Code(err) != codes.OutOfRange {
				t.Errorf("pickSize(%d, %d) = %d, %v; want OutOfRange", tc.req, tc.lim, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("pickSize(%d, %d) = %d, %v; want %d", tc.req, tc.lim, got, err, tc.want)
		}
	}
}

func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want fault
	}{
		{"NodeStageVolume:delay=3s", fault{Method: "NodeStageVolume", Delay: 3 * time.Second, At: atStart}},
		{"NodePublishVolume:error=Unavailable", fault{Method: "NodePublishVolume", Code: codes.Unavailable, At: atStart}},
		{"NodeStageVolume:exit", fault{Method: "NodeStageVolume", Exit: true, At: atMid}},
		{"NodeStageVolume/vol-1:error=internal,at=mid,times=2", fault{Method: "NodeStageVolume", VolumeID: "vol-1", Code: codes.Internal, At: atMid, Times: 2}},
	} {
		got, err := parseFault(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseFault(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		again, err := parseFault(got.String())
		if err != nil || again != got {
			t.Errorf("parseFault(%q.String() = %q) = %+v, %v", tc.in, got.String(), again, err)
		}
	}
	for _, bad := range []string{"", "NodeStageVolume", ":exit", "NodeStageVolume:", "X:delay=soon", "X:error=Nope", "X:error=OK", "X:at=end,exit", "X:times=0,exit", "X:frobnicate", "X:at=mid"} {
		if _, err := parseFault(bad); err == nil {
			t.Errorf("parseFault(%q) succeeded, want an error", bad)
		}
	}
}

func TestPage(t *testing.T) {
	var vols []*volumeState
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		vols = append(vols, &volumeState{ID: id})
	}
	ids := func(vs []*volumeState) string {
		var s []string
		for _, v := range vs {
			s = append(s, v.ID)
		}
		return strings.Join(s, ",")
	}
	got, next, err := page(vols, 2, "")
	if err != nil || ids(got) != "a,b" || next == "" {
		t.Fatalf("first page = %s, %q, %v", ids(got), next, err)
	}
	// Deleting the first volume of the next page does not make the
	// listing skip or repeat any other volume.
	rest := append(vols[:2:2], vols[3:]...)
	got, next, err = page(rest, 2, next)
	if err != nil || ids(got) != "d,e" || next != "" {
		t.Fatalf("second page = %s, %q, %v; want d,e and no token", ids(got), next, err)
	}
	if _, _, err := page(vols, 0, "invalid-token"); status.Code(err) != codes.Aborted {
		t.Errorf("bad token: %v, want Aborted", err)
	}
	if _, _, err := page(vols, -1, ""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative max_entries: %v, want InvalidArgument", err)
	}
}
