package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// formatExec answers the commands SafeFormatAndMount runs as if the fake
// loop devices were disks: blkid finds a file system on a device mkfs has
// formatted, fsck finds nothing wrong. It counts the mkfs runs.
type formatExec struct {
	mu        sync.Mutex
	formatted map[string]bool
	mkfs      int
}

var _ utilexec.Interface = (*formatExec)(nil)

func (e *formatExec) Command(cmd string, args ...string) utilexec.Cmd {
	return &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{func() ([]byte, []byte, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		dev := args[len(args)-1]
		switch {
		case cmd == "blkid" && e.formatted[dev]:
			return []byte("DEVNAME=" + dev + "\nTYPE=ext4\n"), nil, nil
		case cmd == "blkid":
			return nil, nil, testingexec.FakeExitError{Status: 2}
		case cmd == "mkfs.ext4":
			e.formatted[dev] = true
			e.mkfs++
			return nil, nil, nil
		case cmd == "fsck":
			return nil, nil, nil
		}
		return nil, nil, errors.New("unexpected command " + cmd)
	}}}
}

func (e *formatExec) CommandContext(_ context.Context, cmd string, args ...string) utilexec.Cmd {
	return e.Command(cmd, args...)
}

func (e *formatExec) LookPath(file string) (string, error) { return "/sbin/" + file, nil }

func (e *formatExec) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mkfs
}

// kubeletInline is NodePublishVolume of an inline ephemeral volume as
// the kubelet sends it with podInfoOnMount; without it (podInfo false)
// the csi.storage.k8s.io/ keys are missing.
func kubeletInline(id, target string, podInfo bool, attrs map[string]string) *csi.NodePublishVolumeRequest {
	ctx := map[string]string{}
	for k, v := range attrs {
		ctx[k] = v
	}
	if podInfo {
		ctx["csi.storage.k8s.io/pod.name"] = "p"
		ctx["csi.storage.k8s.io/pod.namespace"] = "ns"
		ctx["csi.storage.k8s.io/pod.uid"] = "uid-p"
		ctx["csi.storage.k8s.io/serviceAccount.name"] = "default"
		ctx[ephemeralKey] = "true"
	}
	return &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
		VolumeCapability: mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), VolumeContext: ctx}
}

const inlineID = "csi-5e3b1f0a9c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f"

// TestEphemeralLifecycle publishes an inline volume the two ways the
// kubelet sends one, restarts the driver, and unpublishes it: a volume
// is made (image, loop device, one mkfs, a mount at the target) and kept
// across the restart, and unpublish removes all of it, twice.
func TestEphemeralLifecycle(t *testing.T) {
	for _, podInfo := range []bool{true, false} {
		t.Run(map[bool]string{true: "podInfoOnMount", false: "no pod info"}[podInfo], func(t *testing.T) {
			ex := &formatExec{formatted: map[string]bool{}}
			f := newFixture(t, options{Exec: ex})
			ctx := context.Background()
			target := filepath.Join(f.dir, "pod", "mount")
			if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
				t.Fatal(err)
			}
			pub := kubeletInline(inlineID, target, podInfo, map[string]string{SizeAttribute: "32Mi"})
			if _, err := f.node.NodePublishVolume(ctx, pub); err != nil {
				t.Fatal(err)
			}
			image := filepath.Join(f.dir, "state", "volumes", inlineID+".img")
			if fi, err := os.Stat(image); err != nil || fi.Size() != 32<<20 {
				t.Fatalf("image: %v, %v; want 32Mi", fi, err)
			}
			if n, mkfs := f.loop.count(), ex.count(); n != 1 || mkfs != 1 {
				t.Fatalf("after publish: %d loop devices, %d mkfs runs; want 1, 1", n, mkfs)
			}
			if mps, _ := f.mounter.List(); len(mps) != 1 || mps[0].Path != target {
				t.Fatalf("mounts after publish: %v, want one at %s", mps, target)
			}
			st, err := ReadNodeState(filepath.Join(f.dir, "state"), inlineID)
			if err != nil || !st.Ephemeral || !slices.Equal(st.Targets, []string{target}) || st.StagingPath != "" {
				t.Fatalf("node state %+v, %v; want ephemeral, published at %s", st, err, target)
			}
			if _, err := f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: inlineID, VolumePath: target}); err != nil {
				t.Errorf("NodeGetVolumeStats: %v", err)
			}
			_, err = f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: inlineID, StagingTargetPath: filepath.Join(f.dir, "stage"),
				VolumeCapability: mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)})
			wantCode(t, "stage of an ephemeral volume", err, codes.FailedPrecondition)

			// A restarted driver knows the volume and tears it down.
			f.serve(t, options{NodeID: "node-1", StateDir: filepath.Join(f.dir, "state"), Loop: f.loop, Mounter: f.mounter, Exec: ex})
			unpub := &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}
			for i := range 2 {
				if _, err := f.node.NodeUnpublishVolume(ctx, unpub); err != nil {
					t.Fatalf("unpublish #%d: %v", i, err)
				}
			}
			if mps, _ := f.mounter.List(); len(mps) != 0 {
				t.Errorf("mounts after unpublish: %v", mps)
			}
			if n := f.loop.count(); n != 0 {
				t.Errorf("after unpublish: %d loop devices", n)
			}
			for _, p := range []string{target, image, filepath.Join(f.dir, "state", "volumes", inlineID+".json")} {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s after unpublish: %v, want gone", p, err)
				}
			}
		})
	}
}

// TestEphemeralRollback fails an inline volume's first publish part way:
// what it made is gone again, and a retry makes the volume.
func TestEphemeralRollback(t *testing.T) {
	fail := true
	ex := &formatExec{formatted: map[string]bool{}}
	f := newFixture(t, options{Exec: ex, FaultHook: func(_ context.Context, method, _ string, at faultPoint) error {
		if fail && method == "NodePublishVolume" && at == atMid {
			return status.Error(codes.Unavailable, "injected")
		}
		return nil
	}})
	ctx := context.Background()
	target := filepath.Join(f.dir, "mount")
	pub := kubeletInline(inlineID, target, true, nil)
	_, err := f.node.NodePublishVolume(ctx, pub)
	wantCode(t, "publish with an injected fault", err, codes.Unavailable)
	if n := f.loop.count(); n != 0 {
		t.Errorf("failed publish left %d loop devices", n)
	}
	if entries, err := os.ReadDir(filepath.Join(f.dir, "state", "volumes")); err != nil || len(entries) != 0 {
		t.Errorf("failed publish left state %v, %v", entries, err)
	}
	fail = false
	if _, err := f.node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(f.dir, "state", "volumes", inlineID+".img")); err != nil || fi.Size() != defaultVolumeSize {
		t.Errorf("image without a size attribute: %v, %v; want %d bytes", fi, err, defaultVolumeSize)
	}
}

// TestEphemeralRequests checks what an inline publish is refused for.
func TestEphemeralRequests(t *testing.T) {
	ex := &formatExec{formatted: map[string]bool{}}
	f := newFixture(t, options{Exec: ex})
	ctx := context.Background()
	provisioned := f.create(t, "vol")
	target := filepath.Join(f.dir, "mount")
	if _, err := f.node.NodePublishVolume(ctx, kubeletInline(inlineID, target, true, nil)); err != nil {
		t.Fatal(err)
	}
	with := func(change func(r *csi.NodePublishVolumeRequest)) *csi.NodePublishVolumeRequest {
		r := kubeletInline(inlineID, target, true, nil)
		change(r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  *csi.NodePublishVolumeRequest
		want codes.Code
	}{
		{"size not a quantity", kubeletInline("csi-a", target, true, map[string]string{SizeAttribute: "big"}), codes.InvalidArgument},
		{"unknown attribute", kubeletInline("csi-a", target, true, map[string]string{"speed": "fast"}), codes.InvalidArgument},
		{"staging path given", with(func(r *csi.NodePublishVolumeRequest) { r.StagingTargetPath = filepath.Join(f.dir, "s") }), codes.InvalidArgument},
		{"read-only", with(func(r *csi.NodePublishVolumeRequest) { r.Readonly = true }), codes.InvalidArgument},
		{"block", with(func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability = blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		}), codes.InvalidArgument},
		{"another target", with(func(r *csi.NodePublishVolumeRequest) { r.TargetPath = filepath.Join(f.dir, "other") }), codes.FailedPrecondition},
		{"another size", with(func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[SizeAttribute] = "128Mi" }), codes.AlreadyExists},
		{"a provisioned volume", kubeletInline(provisioned, target, true, nil), codes.FailedPrecondition},
		{"not ephemeral and not staged", with(func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[ephemeralKey] = "false" }), codes.InvalidArgument},
	} {
		_, err := f.node.NodePublishVolume(ctx, tc.req)
		wantCode(t, tc.name, err, tc.want)
	}
	if n, mkfs := f.loop.count(), ex.count(); n != 1 || mkfs != 1 {
		t.Errorf("after refused publishes: %d loop devices, %d mkfs runs; want the first volume's 1, 1", n, mkfs)
	}
	// An unknown volume: nothing at the target is success, something
	// there is NotFound.
	if _, err := f.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-gone", TargetPath: filepath.Join(f.dir, "gone")}); err != nil {
		t.Errorf("unpublish of an unknown volume with no target: %v", err)
	}
	_, err := f.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-gone", TargetPath: target})
	wantCode(t, "unpublish of an unknown volume at a mount", err, codes.NotFound)
}

func TestEphemeralSize(t *testing.T) {
	for _, tc := range []struct {
		attrs map[string]string
		want  int64
		code  codes.Code
	}{
		{nil, defaultVolumeSize, codes.OK},
		{map[string]string{SizeAttribute: "20Mi", ephemeralKey: "true"}, 20 << 20, codes.OK},
		{map[string]string{SizeAttribute: "20000001"}, 20000768, codes.OK},
		{map[string]string{SizeAttribute: "1Mi"}, minVolumeSize, codes.OK},
		{map[string]string{SizeAttribute: "0"}, 0, codes.InvalidArgument},
		{map[string]string{SizeAttribute: "-1Gi"}, 0, codes.InvalidArgument},
		{map[string]string{"csi.storage.k8s.io/pod.name": "p"}, defaultVolumeSize, codes.OK},
	} {
		got, err := ephemeralSize(tc.attrs)
		if status.Code(err) != tc.code || got != tc.want {
			t.Errorf("ephemeralSize(%v) = %d, %v; want %d, %v", tc.attrs, got, err, tc.want, tc.code)
		}
	}
}
