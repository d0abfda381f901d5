package csiplugin

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/volume"
)

// Symlinks planted under the root must never be followed: each test plants
// one pointing to a directory outside the root and checks that the
// operation fails with an error naming the symlink, that the driver got no
// call with a path through it, that nothing was mounted, and that the
// outside directory is exactly as it was.

// outside returns a directory outside the root holding entries (a trailing
// "/" makes a directory; a "name->target" entry a symlink).
func outside(t *testing.T, entries ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, e := range entries {
		p := filepath.Join(dir, e)
		var err error
		switch {
		case strings.HasSuffix(e, "/"):
			err = os.MkdirAll(p, 0o750)
		case strings.Contains(e, "->"):
			name, target, _ := strings.Cut(e, "->")
			err = os.Symlink(target, filepath.Join(dir, name))
		default:
			if err = os.MkdirAll(filepath.Dir(p), 0o750); err == nil {
				err = os.WriteFile(p, []byte(`{"volumeHandle":"vol-1","driverName":"`+drv+`","specVolID":"pv-1"}`), 0o640)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// snapshot lists everything under dir with its type and content.
func snapshot(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		entry := rel + " " + d.Type().String()
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(path)
			entry += " -> " + target
		case d.Type().IsRegular():
			data, _ := os.ReadFile(path)
			entry += " " + string(data)
		}
		out = append(out, entry)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// plant makes link (under the root) a symlink to target, creating its
// parent directories.
func plant(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// confinedCheck asserts what every refused operation must leave behind.
type confinedCheck struct {
	e       *env
	out     string
	before  []string
	methods []string // driver calls that must not have been made
}

func newCheck(t *testing.T, e *env, out string, methods ...string) *confinedCheck {
	t.Helper()
	e.srv.Reset()
	return &confinedCheck{e: e, out: out, before: snapshot(t, out), methods: methods}
}

func (c *confinedCheck) assert(t *testing.T, err error, link string) {
	t.Helper()
	if err == nil {
		t.Errorf("the operation through symlink %s succeeded", link)
	} else if !strings.Contains(err.Error(), link+" is a symlink") {
		t.Errorf("error %q does not say that %s is a symlink", err, link)
	}
	for _, m := range c.methods {
		if n := c.e.srv.Calls(m); n != 0 {
			t.Errorf("the driver got %d %s calls", n, m)
		}
	}
	for _, a := range c.e.mounter.GetLog() {
		t.Errorf("mounter %s of %s (from %s)", a.Action, a.Target, a.Source)
	}
	if after := snapshot(t, c.out); !slices.Equal(after, c.before) {
		t.Errorf("the directory outside the root changed:\nbefore %q\nafter  %q", c.before, after)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the planted symlink %s is gone or replaced: %v, %v", link, fi, err)
	}
}

func TestSetUpRefusesSymlinks(t *testing.T) {
	vol := podVolume("a", "data")
	pod := string(vol.Pod.UID)
	for _, tt := range []struct {
		name string
		link string // relative to the root
	}{
		{"pod directory", "pods/" + pod},
		{"volumes directory", "pods/" + pod + "/volumes"},
		{"plugin directory", "pods/" + pod + "/volumes/kubernetes.io~csi"},
		{"volume directory", "pods/" + pod + "/volumes/kubernetes.io~csi/pv-1"},
		{"mount", "pods/" + pod + "/volumes/kubernetes.io~csi/pv-1/mount"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
			out := outside(t, "keep")
			link := filepath.Join(e.root, tt.link)
			plant(t, out, link)
			c := newCheck(t, e, out, "NodePublishVolume")
			_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: vol})
			c.assert(t, err, link)
			if got := e.srv.PublishedVolumes()["vol-1"]; len(got) != 0 {
				t.Errorf("published at %v", got)
			}
		})
	}
}

// TestTearDownRefusesSymlinks: a pod directory that is a symlink to a
// directory laid out like a pod's, with a valid vol_data.json, is not torn
// down: nothing there is unpublished or removed.
func TestTearDownRefusesSymlinks(t *testing.T) {
	vol := podVolume("a", "data")
	pod := string(vol.Pod.UID)
	for _, tt := range []struct {
		name string
		link string
		out  []string // the outside tree
		real string   // a real volume directory to create under the root, if any
	}{
		{"pod directory", "pods/" + pod, []string{"volumes/kubernetes.io~csi/pv-1/vol_data.json", "volumes/kubernetes.io~csi/pv-1/mount/data"}, ""},
		{"volumes directory", "pods/" + pod + "/volumes", []string{"kubernetes.io~csi/pv-1/vol_data.json", "kubernetes.io~csi/pv-1/mount/"}, ""},
		{"volume directory", "pods/" + pod + "/volumes/kubernetes.io~csi/pv-1", []string{"vol_data.json", "mount/"}, ""},
		{"mount", "pods/" + pod + "/volumes/kubernetes.io~csi/pv-1/mount", []string{"data"}, "pods/" + pod + "/volumes/kubernetes.io~csi/pv-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
			out := outside(t, tt.out...)
			if tt.real != "" {
				if err := os.MkdirAll(filepath.Join(e.root, tt.real), 0o750); err != nil {
					t.Fatal(err)
				}
			}
			link := filepath.Join(e.root, tt.link)
			plant(t, out, link)
			c := newCheck(t, e, out, "NodeUnpublishVolume")
			err := e.p.TearDown(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: vol})
			c.assert(t, err, link)
		})
	}
}

func TestMountDeviceRefusesSymlinks(t *testing.T) {
	staging := "plugins/kubernetes.io/csi/" + drv + "/" + sha256Hex("vol-1")
	for _, tt := range []struct {
		name string
		link string
	}{
		{"plugins directory", "plugins"},
		{"driver directory", "plugins/kubernetes.io/csi/" + drv},
		{"staging directory", staging},
		{"globalmount", staging + "/globalmount"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			out := outside(t, "keep")
			link := filepath.Join(e.root, tt.link)
			plant(t, out, link)
			c := newCheck(t, e, out, "NodeStageVolume")
			_, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(drv)})
			c.assert(t, err, link)
			if path, staged := e.srv.StagedVolumes()["vol-1"]; staged {
				t.Errorf("staged at %s", path)
			}
		})
	}
}

// TestUnmountDeviceRefusesSymlinks: a staging directory that is a symlink
// to a directory laid out like one is neither unstaged nor removed.
func TestUnmountDeviceRefusesSymlinks(t *testing.T) {
	staging := "plugins/kubernetes.io/csi/" + drv + "/" + sha256Hex("vol-1")
	for _, tt := range []struct {
		name string
		link string
		out  []string
		real string
	}{
		{"driver directory", "plugins/kubernetes.io/csi/" + drv, []string{sha256Hex("vol-1") + "/vol_data.json", sha256Hex("vol-1") + "/globalmount/"}, ""},
		{"staging directory", staging, []string{"vol_data.json", "globalmount/"}, ""},
		{"globalmount", staging + "/globalmount", []string{"data"}, staging},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			out := outside(t, tt.out...)
			if tt.real != "" {
				if err := os.MkdirAll(filepath.Join(e.root, tt.real), 0o750); err != nil {
					t.Fatal(err)
				}
			}
			link := filepath.Join(e.root, tt.link)
			plant(t, out, link)
			c := newCheck(t, e, out, "NodeUnstageVolume")
			err := e.p.UnmountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(drv)})
			c.assert(t, err, link)
		})
	}
}

// fakeLooper is a loop-device table for the default block mapper.
type fakeLooper struct{ dev map[string]string }

func (f *fakeLooper) Attach(_ context.Context, path string) (string, error) {
	f.dev[path] = "/dev/loop9"
	return "/dev/loop9", nil
}
func (f *fakeLooper) Find(_ context.Context, path string) (string, error) { return f.dev[path], nil }
func (f *fakeLooper) Detach(_ context.Context, dev string) error {
	for p, d := range f.dev {
		if d == dev {
			delete(f.dev, p)
		}
	}
	return nil
}

// blockEnv is an env whose plugin maps block volumes with its default
// mapper (bind mounts through the fake mounter, fake loop devices).
func blockEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	m, ok := e.p.blockMapper.(*blockdev.Mapper)
	if !ok {
		t.Fatalf("the default block mapper is a %T", e.p.blockMapper)
	}
	m.Loop = &fakeLooper{dev: map[string]string{}}
	m.IsBlockDevice = func(string) (bool, error) { return true, nil }
	return e
}

func TestBlockRefusesSymlinks(t *testing.T) {
	vol := podVolume("a", "data")
	pod := string(vol.Pod.UID)
	const devices = "plugins/kubernetes.io/csi/volumeDevices"
	for _, tt := range []struct {
		name string
		link string
		op   string // "stage", "publish" (stage first), "unpublish" (stage and publish first), "unstage"
		out  []string
	}{
		{"staging path", devices + "/staging/pv-1", "stage", nil},
		{"volume directory on stage", devices + "/pv-1", "stage", nil},
		{"volume directory on publish", devices + "/pv-1", "publish", nil},
		{"publish directory", devices + "/publish/pv-1", "publish", nil},
		{"pod device directory", "pods/" + pod + "/volumeDevices/kubernetes.io~csi", "publish", nil},
		{"pod volumeDevices directory", "pods/" + pod + "/volumeDevices", "publish", nil},
		{"pod directory", "pods/" + pod, "publish", nil},
		{"pod device directory on unpublish", "pods/" + pod + "/volumeDevices/kubernetes.io~csi", "unpublish", []string{"pv-1->/dev/sda"}},
		{"map file directory on unpublish", devices + "/pv-1/dev", "unpublish", []string{uidFile(pod)}},
		{"staging path on unstage", devices + "/staging/pv-1", "unstage", []string{"keep"}},
		{"publish directory on unstage", devices + "/publish/pv-1", "unstage", []string{pod}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := blockEnv(t)
			ctx := context.Background()
			spec := blockSpec()
			req := volume.MountRequest{Spec: spec, Volume: vol}
			out := outside(t, append([]string{"keep"}, tt.out...)...)
			if tt.op == "unpublish" || tt.op == "unstage" {
				// The paths are real while the volume is set up.
				staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
				if err != nil {
					t.Fatal(err)
				}
				if tt.op == "unpublish" {
					req.DeviceMountPath = staging
					if _, err := e.p.SetUp(ctx, req); err != nil {
						t.Fatal(err)
					}
					e.mounter.ResetLog()
				}
				// Swapped for a symlink while it is set up: the real
				// directory moves aside (its content stays under the root).
				err = os.Rename(filepath.Join(e.root, tt.link), filepath.Join(e.root, tt.link+".aside"))
				if err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			} else if tt.op == "publish" {
				staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
				if err != nil {
					t.Fatal(err)
				}
				req.DeviceMountPath = staging
				if tt.link == devices+"/pv-1" {
					// Already there from the stage: swapped for a symlink.
					if err := os.RemoveAll(filepath.Join(e.root, tt.link)); err != nil {
						t.Fatal(err)
					}
				}
			}
			link := filepath.Join(e.root, tt.link)
			plant(t, out, link)
			var methods []string
			switch tt.op {
			case "stage":
				methods = []string{"NodeStageVolume"}
			case "publish":
				methods = []string{"NodePublishVolume"}
			case "unpublish":
				methods = []string{"NodeUnpublishVolume"}
			case "unstage":
				if tt.link == devices+"/staging/pv-1" {
					methods = []string{"NodeUnstageVolume"}
				} // else the driver may unstage (at the real staging path); the removal is refused
			}
			c := newCheck(t, e, out, methods...)
			var err error
			switch tt.op {
			case "stage":
				_, err = e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			case "publish":
				_, err = e.p.SetUp(ctx, req)
			case "unpublish":
				err = e.p.TearDown(ctx, req)
			case "unstage":
				err = e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
			}
			c.assert(t, err, link)
		})
	}
}

// uidFile is a map file named after the pod, as the mapper makes.
func uidFile(pod string) string { return pod }
