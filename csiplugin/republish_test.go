package csiplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// TestFailedRepublishKeepsVolumeDir: a publish that fails finally removes
// the pod's volume directory, its vol_data.json and its record, unless it
// is a republish (the pod may be using what the earlier publish left, here
// a target the driver made but did not mount): that leaves all three, the
// record in flight so that a restart finds the volume Uncertain.
func TestFailedRepublishKeepsVolumeDir(t *testing.T) {
	for _, tc := range []struct {
		name      string
		republish bool
		code      codes.Code
		kept      bool
	}{
		{name: "first publish, final error", code: codes.InvalidArgument},
		{name: "republish, final error", republish: true, code: codes.InvalidArgument, kept: true},
		{name: "republish, error in progress", republish: true, code: codes.DeadlineExceeded, kept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
			ctx := context.Background()
			spec := testSpec(drv)
			vol := podVolume("a", "data")
			req := volume.MountRequest{Spec: spec, Volume: vol}
			path, err := e.p.SetUp(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			e.srv.Inject(csitest.Fault{Method: "NodePublishVolume", Err: status.Error(tc.code, "injected"), Times: 1})
			req.Republish = tc.republish
			if _, err := e.p.SetUp(ctx, req); err == nil {
				t.Fatal("SetUp succeeded despite the injected error")
			}
			recDir, dataFile := filepath.Dir(path), filepath.Join(filepath.Dir(path), ondisk.VolumeDataFile)
			rec, rerr := e.readRecord(t, recDir)
			if tc.kept != (rerr == nil) || rerr == nil && rec.Phase != ondisk.PhasePublishing {
				t.Errorf("record of %s: %+v, %v; want it kept (Publishing): %v", recDir, rec, rerr, tc.kept)
			} else if !tc.kept && !errors.Is(rerr, fs.ErrNotExist) {
				t.Errorf("record of %s: %v, want it gone", recDir, rerr)
			}
			for _, p := range []string{path, dataFile} {
				if _, err := os.Lstat(p); tc.kept != (err == nil) {
					t.Errorf("%s: %v; want it kept: %v", p, err, tc.kept)
				}
			}
		})
	}
}
