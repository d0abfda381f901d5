package csiplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// readRecord reads the record of dir (absolute) under e's root.
func (e *env) readRecord(t *testing.T, dir string) (*ondisk.Record, error) {
	t.Helper()
	r, err := rootfs.New(e.root)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := r.Rel(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ondisk.ReadRecord(r, rel)
}

// phaseDuring returns the phase of dir's record while the driver holds a
// call of method, and the error of op.
func (e *env) phaseDuring(t *testing.T, method, dir string, op func() error) (ondisk.Phase, error) {
	t.Helper()
	block := make(chan struct{})
	e.srv.Inject(csitest.Fault{Method: method, Block: block, Times: 1})
	before := e.srv.Calls(method)
	done := make(chan error, 1)
	go func() { done <- op() }()
	if err := e.srv.WaitForCalls(context.Background(), method, before+1); err != nil {
		t.Fatal(err)
	}
	var ph ondisk.Phase
	rec, err := e.readRecord(t, dir)
	if err != nil {
		t.Errorf("record of %s during %s: %v", dir, method, err)
	} else {
		ph = rec.Phase
	}
	close(block)
	return ph, <-done
}

// TestRecordsFollowCalls: before each of NodeStage, NodePublish,
// NodeUnpublish and NodeUnstage the record says the call is in flight;
// after a stage or publish it says done; after an unpublish or unstage it
// is gone. It holds what recovery needs and never a secret's value.
func TestRecordsFollowCalls(t *testing.T) {
	e := newEnv(t, envOptions{
		driver:  csitest.Options{CreateTargetDirs: true},
		objects: []runtime.Object{csitest.Secret("secrets", "stage", map[string]string{"user": "s3cr3t-value"})},
	})
	spec := testSpec(drv)
	spec.MountOptions = []string{"noatime"}
	spec.NodeStageSecret = &podvol.SecretRef{Namespace: "secrets", Name: "stage"}
	pc := map[string]string{"devicePath": "/dev/xvdb"}
	ctx := context.Background()
	stagingDir, _ := ondisk.StagingDir(e.root, drv, "vol-1")
	vol := podVolume("a", "data")
	volDir := filepath.Join(e.root, "pods", string(vol.Pod.UID), "volumes/kubernetes.io~csi/pv-1")

	var stagingPath string
	ph, err := e.phaseDuring(t, "NodeStageVolume", stagingDir, func() (err error) {
		stagingPath, err = e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec, PublishContext: pc})
		return err
	})
	if err != nil || ph != ondisk.PhaseStaging {
		t.Fatalf("MountDevice: %v; phase during NodeStageVolume %q, want %q", err, ph, ondisk.PhaseStaging)
	}
	rec, err := e.readRecord(t, stagingDir)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Phase != ondisk.PhaseStaged || rec.BootID != e.p.BootID() || rec.BootID == "" || rec.VolumeHandle != "vol-1" ||
		rec.Driver != drv || rec.PVName != "pv-1" || rec.PublishContext["devicePath"] != "/dev/xvdb" ||
		rec.FSType != "ext4" || rec.AccessMode != "SINGLE_NODE_WRITER" || len(rec.MountOptions) != 1 ||
		rec.StageSecretRef == nil || rec.StageSecretRef.Name != "stage" {
		t.Errorf("staging record after NodeStageVolume = %+v", rec)
	}
	data, err := os.ReadFile(filepath.Join(e.root, ondisk.RecordFile(rec.Dir)))
	if err != nil || strings.Contains(string(data), "s3cr3t-value") {
		t.Errorf("record %s holds the secret's value (or cannot be read: %v)", data, err)
	}

	ph, err = e.phaseDuring(t, "NodePublishVolume", volDir, func() error {
		_, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, PublishContext: pc, DeviceMountPath: stagingPath})
		return err
	})
	if err != nil || ph != ondisk.PhasePublishing {
		t.Fatalf("SetUp: %v; phase during NodePublishVolume %q, want %q", err, ph, ondisk.PhasePublishing)
	}
	if rec, err := e.readRecord(t, volDir); err != nil || rec.Phase != ondisk.PhasePublished || rec.PodUID != "uid-a" || rec.SpecName != "pv-1" {
		t.Errorf("pod record after NodePublishVolume = %+v, %v", rec, err)
	}

	ph, err = e.phaseDuring(t, "NodeUnpublishVolume", volDir, func() error {
		return e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol})
	})
	if err != nil || ph != ondisk.PhaseUnpublishing {
		t.Fatalf("TearDown: %v; phase during NodeUnpublishVolume %q, want %q", err, ph, ondisk.PhaseUnpublishing)
	}
	if _, err := e.readRecord(t, volDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pod record after TearDown: %v, want none", err)
	}
	ph, err = e.phaseDuring(t, "NodeUnstageVolume", stagingDir, func() error {
		return e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
	})
	if err != nil || ph != ondisk.PhaseUnstaging {
		t.Fatalf("UnmountDevice: %v; phase during NodeUnstageVolume %q, want %q", err, ph, ondisk.PhaseUnstaging)
	}
	if _, err := e.readRecord(t, stagingDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("staging record after UnmountDevice: %v, want none", err)
	}
	var left []string
	err = filepath.WalkDir(filepath.Join(e.root, ondisk.RecordsDir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return err
	})
	if err != nil || len(left) != 0 {
		t.Errorf("records left: %v (%v)", left, err)
	}
}

// TestRecordAfterFailure: a final failure removes the record with the
// directory; a call that may still be running leaves it in flight.
func TestRecordAfterFailure(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	for _, tc := range []struct {
		code codes.Code
		want ondisk.Phase // "" for no record
	}{
		{codes.InvalidArgument, ""},
		{codes.DeadlineExceeded, ondisk.PhaseStaging},
	} {
		spec := testSpec(drv)
		spec.VolumeHandle = "vol-" + tc.code.String()
		e.srv.Inject(csitest.Fault{Method: "NodeStageVolume", VolumeID: spec.VolumeHandle, Err: status.Error(tc.code, "injected"), Times: 1})
		if _, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec}); err == nil {
			t.Fatalf("%v: MountDevice succeeded", tc.code)
		}
		dir, _ := ondisk.StagingDir(e.root, drv, spec.VolumeHandle)
		rec, err := e.readRecord(t, dir)
		switch {
		case tc.want == "" && !errors.Is(err, fs.ErrNotExist):
			t.Errorf("%v: record %+v, %v; want none", tc.code, rec, err)
		case tc.want != "" && (err != nil || rec.Phase != tc.want):
			t.Errorf("%v: record %+v, %v; want phase %s", tc.code, rec, err, tc.want)
		}
	}
}

func write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBlockRecordsFollowCalls: a raw block volume's stage and publish are
// recorded as files are (keyed by its staging and publish paths), and the
// records go with the teardown.
func TestBlockRecordsFollowCalls(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	e.p.blockMapper = &fakeBlockMapper{}
	ctx := context.Background()
	spec := blockSpec()
	vol := podVolume("a", "data")
	paths, err := ondisk.BlockVolumePaths(e.root, "pv-1", vol.Pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	ph, err := e.phaseDuring(t, "NodeStageVolume", paths.StagingPath, func() error {
		_, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
		return err
	})
	if err != nil || ph != ondisk.PhaseStaging {
		t.Fatalf("MountDevice: %v; phase during NodeStageVolume %q", err, ph)
	}
	ph, err = e.phaseDuring(t, "NodePublishVolume", paths.PublishPath, func() error {
		_, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: paths.StagingPath})
		return err
	})
	if err != nil || ph != ondisk.PhasePublishing {
		t.Fatalf("SetUp: %v; phase during NodePublishVolume %q", err, ph)
	}
	for dir, want := range map[string]ondisk.Phase{paths.StagingPath: ondisk.PhaseStaged, paths.PublishPath: ondisk.PhasePublished} {
		if rec, err := e.readRecord(t, dir); err != nil || rec.Phase != want || rec.Mode != "Block" {
			t.Errorf("record of %s = %+v, %v; want %s", dir, rec, err, want)
		}
	}
	ph, err = e.phaseDuring(t, "NodeUnpublishVolume", paths.PublishPath, func() error {
		return e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol})
	})
	if err != nil || ph != ondisk.PhaseUnpublishing {
		t.Fatalf("TearDown: %v; phase during NodeUnpublishVolume %q", err, ph)
	}
	ph, err = e.phaseDuring(t, "NodeUnstageVolume", paths.StagingPath, func() error {
		return e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
	})
	if err != nil || ph != ondisk.PhaseUnstaging {
		t.Fatalf("UnmountDevice: %v; phase during NodeUnstageVolume %q", err, ph)
	}
	for _, dir := range []string{paths.StagingPath, paths.PublishPath} {
		if _, err := e.readRecord(t, dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("record of %s after teardown: %v, want none", dir, err)
		}
	}
}

// TestRecordNotRegularFileTakenBack: anything but a regular file where a
// record goes (a symlink, an empty directory, a FIFO) is removed without
// being followed and the record written: a stage and a publish succeed
// (they failed for good before), and what a symlink pointed to is
// untouched. Issue 23, crash window 3.
func TestRecordNotRegularFileTakenBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, name, outside string)
	}{
		{"symlink", func(t *testing.T, name, outside string) {
			if err := os.Symlink(outside, name); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty directory", func(t *testing.T, name, _ string) {
			if err := os.Mkdir(name, 0o750); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, name, _ string) {
			if err := syscall.Mkfifo(name, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			ctx := context.Background()
			spec := testSpec(drv)
			vol := podVolume("a", "data")
			stagingDir, _ := ondisk.StagingDir(e.root, drv, spec.VolumeHandle)
			volDir, _ := ondisk.PodVolumeDir(e.root, vol.Pod.UID, ondisk.VolumeDirName(spec, vol))
			outside := filepath.Join(t.TempDir(), "outside")
			write(t, outside, "keep")
			for _, dir := range []string{stagingDir, volDir} {
				rel, _ := filepath.Rel(e.root, dir)
				name := filepath.Join(e.root, ondisk.RecordFile(rel))
				if err := os.MkdirAll(filepath.Dir(name), 0o750); err != nil {
					t.Fatal(err)
				}
				tc.plant(t, name, outside)
			}

			stagingPath, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			if err != nil {
				t.Fatalf("MountDevice: %v", err)
			}
			if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: stagingPath}); err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			for dir, want := range map[string]ondisk.Phase{stagingDir: ondisk.PhaseStaged, volDir: ondisk.PhasePublished} {
				if rec, err := e.readRecord(t, dir); err != nil || rec.Phase != want {
					t.Errorf("record of %s = %+v, %v; want %s", dir, rec, err, want)
				}
			}
			if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
				t.Errorf("the symlink's target: %q, %v; want it untouched", b, err)
			}
		})
	}
}
