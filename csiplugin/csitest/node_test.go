package csitest

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// step is one call in a scenario and the code it must return.
type step struct {
	call func(c *client) error
	want codes.Code
	// msg, when set, must appear in the error message.
	msg string
}

func TestNodeOrderingAndValidation(t *testing.T) {
	const v, st, tp, tp2 = "vol-1", "/staging/a", "/pods/1/mount", "/pods/2/mount"
	stage := func(vol, path string, vc *csi.VolumeCapability) func(*client) error {
		return func(c *client) error { return c.stage(vol, path, vc) }
	}
	unstage := func(vol, path string) func(*client) error {
		return func(c *client) error { return c.unstage(vol, path) }
	}
	publish := func(vol, staging, target string, vc *csi.VolumeCapability, ro bool) func(*client) error {
		return func(c *client) error { return c.publish(vol, staging, target, vc, ro) }
	}
	unpublish := func(vol, target string) func(*client) error {
		return func(c *client) error { return c.unpublish(vol, target) }
	}
	noMode := &csi.VolumeCapability{AccessType: mountCap().AccessType}
	noType := &csi.VolumeCapability{AccessMode: mountCap().AccessMode}
	tests := []struct {
		name  string
		opts  Options
		steps []step
		// staged and published describe v's state at the end.
		staged    string
		published []string
	}{{
		name: "stage, publish twice, unpublish, unstage",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp2, mountCap(), true)},
			{call: unpublish(v, tp)},
			{call: unpublish(v, tp2)},
			{call: unstage(v, st)},
		},
	}, {
		name: "repeats with the same arguments succeed",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp, mountCap(), false)},
		},
		staged: st, published: []string{tp},
	}, {
		name: "missing fields name the field",
		steps: []step{
			{call: stage("", st, mountCap()), want: codes.InvalidArgument, msg: "volume_id"},
			{call: stage(v, "", mountCap()), want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: stage(v, st, nil), want: codes.InvalidArgument, msg: "volume_capability"},
			{call: stage(v, st, noMode), want: codes.InvalidArgument, msg: "access_mode"},
			{call: stage(v, st, noType), want: codes.InvalidArgument, msg: "access_type"},
			{call: unstage("", st), want: codes.InvalidArgument, msg: "volume_id"},
			{call: unstage(v, ""), want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: publish("", st, tp, mountCap(), false), want: codes.InvalidArgument, msg: "volume_id"},
			{call: publish(v, st, "", mountCap(), false), want: codes.InvalidArgument, msg: "target_path"},
			{call: func(c *client) error {
				_, err := c.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
					VolumeId: v, TargetPath: tp, VolumeCapability: mountCap(),
					VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "false"},
				})
				return err
			}, want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: publish(v, st, tp, nil, false), want: codes.InvalidArgument, msg: "volume_capability"},
			{call: unpublish("", tp), want: codes.InvalidArgument, msg: "volume_id"},
			{call: unpublish(v, ""), want: codes.InvalidArgument, msg: "target_path"},
		},
	}, {
		name: "publish before stage fails",
		steps: []step{
			{call: publish(v, st, tp, mountCap(), false), want: codes.FailedPrecondition},
		},
	}, {
		name: "publish from another staging path fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, "/staging/b", tp, mountCap(), false), want: codes.FailedPrecondition},
		},
		staged: st,
	}, {
		name: "inline ephemeral volumes are published without staging",
		steps: []step{
			{call: publish(v, "", tp, mountCap(), false)},
			{call: publish(v, "", tp, mountCap(), false)},
			{call: unpublish(v, tp)},
		},
	}, {
		name: "a staged volume published without its staging path fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, "", tp, mountCap(), false), want: codes.FailedPrecondition},
		},
		staged: st,
	}, {
		name: "unstage while published fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: unstage(v, st), want: codes.FailedPrecondition},
		},
		staged: st, published: []string{tp},
	}, {
		name: "stage at another path or with another capability fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: stage(v, "/staging/b", mountCap()), want: codes.AlreadyExists},
			{call: stage(v, st, blockCap()), want: codes.AlreadyExists},
		},
		staged: st,
	}, {
		name: "publish again with other arguments fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp, mountCap(), true), want: codes.AlreadyExists},
			{call: publish(v, st, tp, blockCap(), false), want: codes.AlreadyExists},
		},
		staged: st, published: []string{tp},
	}, {
		name: "unpublish and unstage of unknown volumes or paths succeed",
		steps: []step{
			{call: unpublish("nothing", tp)},
			{call: unstage("nothing", st)},
			{call: stage(v, st, mountCap())},
			{call: unstage(v, "/staging/other")},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: unpublish(v, tp2)},
		},
		staged: st, published: []string{tp},
	}, {
		name: "without STAGE_UNSTAGE, publish needs no staging and stage is unimplemented",
		opts: Options{NoStageUnstage: true},
		steps: []step{
			{call: stage(v, st, mountCap()), want: codes.Unimplemented},
			{call: unstage(v, st), want: codes.Unimplemented},
			{call: publish(v, "", tp, mountCap(), false)},
			{call: publish(v, "", tp, mountCap(), false)},
		},
		published: []string{tp},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(t, tt.opts)
			c := dial(t, s)
			for i, st := range tt.steps {
				err := st.call(c)
				if got := status.Code(err); got != st.want {
					t.Fatalf("step %d: got %v (%v), want %v", i, got, err, st.want)
				}
				if st.msg != "" && !strings.Contains(status.Convert(err).Message(), st.msg) {
					t.Errorf("step %d: error %q does not name %q", i, err, st.msg)
				}
			}
			path, ok := s.StagedVolumes()[v]
			if path != tt.staged || ok != (tt.staged != "") {
				t.Errorf("Staged = %q, %v; want %q", path, ok, tt.staged)
			}
			if got := s.PublishedVolumes()[v]; strings.Join(got, ",") != strings.Join(tt.published, ",") {
				t.Errorf("Published = %v, want %v", got, tt.published)
			}
		})
	}
}

func TestStateQueries(t *testing.T) {
	s := New(t, Options{})
	c := dial(t, s)
	for _, v := range []string{"b", "a", "c"} {
		if err := c.stage(v, "/st/"+v, mountCap()); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range []string{"/p/2", "/p/1"} {
		if err := c.publish("a", "/st/a", target, mountCap(), false); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(slices.Sorted(maps.Keys(s.StagedVolumes())), ","); got != "a,b,c" {
		t.Errorf("StagedVolumes = %s", got)
	}
	if got := strings.Join(slices.Sorted(maps.Keys(s.PublishedVolumes())), ","); got != "a" {
		t.Errorf("PublishedVolumes = %s", got)
	}
	if got := strings.Join(s.PublishedVolumes()["a"], ","); got != "/p/1,/p/2" {
		t.Errorf("Published(a) = %s", got)
	}
}

func TestStatsAndExpand(t *testing.T) {
	s := New(t, Options{GetVolumeStats: true, Expand: true})
	c := dial(t, s)
	ctx := ctxFor(t)
	if _, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/p"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of an unknown volume: %v, want NotFound", err)
	}
	if err := c.stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", "/p", mountCap(), false); err != nil {
		t.Fatal(err)
	}
	st, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/p"})
	if err != nil || len(st.GetUsage()) != 2 || st.GetUsage()[0].GetTotal() != DefaultCapacity {
		t.Fatalf("stats = %v, %v", st, err)
	}
	if u := st.GetUsage()[0]; u.GetUsed()+u.GetAvailable() != u.GetTotal() {
		t.Errorf("implausible usage %v", u)
	}
	ex, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: "v", VolumePath: "/p", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30},
	})
	if err != nil || ex.GetCapacityBytes() != 2<<30 {
		t.Fatalf("expand = %v, %v", ex, err)
	}
	st, err = c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/st"})
	if err != nil || st.GetUsage()[0].GetTotal() != 2<<30 {
		t.Errorf("stats after expand = %v, %v", st, err)
	}
}

func TestCreateTargetDirs(t *testing.T) {
	s := New(t, Options{CreateTargetDirs: true})
	c := dial(t, s)
	root := t.TempDir()
	mnt := filepath.Join(root, "pods", "1", "mount")
	dev := filepath.Join(root, "block", "publish", "1")
	if err := c.stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", mnt, mountCap(), false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(mnt); err != nil || !fi.IsDir() {
		t.Errorf("mount target: %v, %v", fi, err)
	}
	if err := c.stage("b", "/stb", blockCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("b", "/stb", dev, blockCap(), false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dev); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("block target: %v, %v", fi, err)
	}
	// A target the caller made first (FakeMounter flows) is fine.
	pre := filepath.Join(root, "pods", "2", "mount")
	if err := os.MkdirAll(pre, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", pre, mountCap(), false); err != nil {
		t.Fatal(err)
	}
	for vol, p := range map[string]string{"v": mnt, "b": dev} {
		if err := c.unpublish(vol, p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed: %v", p, err)
		}
	}
}
