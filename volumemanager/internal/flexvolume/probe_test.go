package flexvolume

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// writeDriver writes an sh driver whose init answers caps (a JSON object)
// at {dir}/{vendor~driver}/{driver}, through a temporary name so that the
// watcher never sees a half-written file.
func writeDriver(t *testing.T, dir, name, caps string) {
	t.Helper()
	d := filepath.Join(dir, escape(name))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ncase \"$1\" in\ninit) echo '{\"status\":\"Success\",\"capabilities\":" + caps + "}';;\n*) echo '{\"status\":\"Not supported\"}';;\nesac\n"
	tmp := filepath.Join(d, ".tmp")
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d, name[strings.LastIndex(name, "/")+1:])); err != nil {
		t.Fatal(err)
	}
}

// runDrivers runs ds and returns the changes it hands over, one batch at a
// time.
func runDrivers(t *testing.T, ds *Drivers) <-chan []Change {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan []Change, 16)
	done := make(chan struct{})
	go func() { defer close(done); ds.Run(ctx, func(c []Change) { got <- c }) }()
	t.Cleanup(func() { cancel(); <-done })
	return got
}

// next waits for the change of driver name, skipping others.
func next(t *testing.T, got <-chan []Change, name string) Change {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case batch := <-got:
			for _, c := range batch {
				if c.Driver == name {
					return c
				}
			}
		case <-timeout:
			t.Fatalf("no change of driver %s", name)
		}
	}
}

func TestProbeFindsDriversAddedChangedAndRemoved(t *testing.T) {
	dir := t.TempDir()
	writeDriver(t, dir, "example.com/first", `{"attach":false}`)
	if err := os.MkdirAll(filepath.Join(dir, ".hidden"), 0o755); err != nil {
		t.Fatal(err)
	}
	ds, err := New(Config{PluginDir: dir, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	got := runDrivers(t, ds)
	c := next(t, got, "example.com/first")
	if c.Plugin == nil || c.Plugin.Name() != "example.com/first" {
		t.Fatalf("start: %+v, want the driver's plugin", c)
	}
	if caps, _ := c.Plugin.Capabilities(&podvol.VolumeSpec{}); caps.Attachable {
		t.Errorf("capabilities %+v, want init's attach false", caps)
	}
	<-ds.Started()

	writeDriver(t, dir, "example.com/second", `{}`)
	c = next(t, got, "example.com/second")
	if c.Plugin == nil {
		t.Fatalf("added: %+v, want a plugin", c)
	}
	if caps, _ := c.Plugin.Capabilities(&podvol.VolumeSpec{}); !caps.Attachable {
		t.Errorf("capabilities %+v, want the kubelet's default attach true", caps)
	}

	writeDriver(t, dir, "example.com/first", `{"attach":true}`)
	c = next(t, got, "example.com/first")
	if c.Plugin == nil {
		t.Fatalf("changed: %+v, want a plugin", c)
	}
	if caps, _ := c.Plugin.Capabilities(&podvol.VolumeSpec{}); !caps.Attachable {
		t.Errorf("after a change, capabilities %+v, want the new init's attach true", caps)
	}

	if err := os.RemoveAll(filepath.Join(dir, "example.com~second")); err != nil {
		t.Fatal(err)
	}
	if c := next(t, got, "example.com/second"); c.Plugin != nil || c.Err != nil {
		t.Errorf("removed: %+v, want no plugin", c)
	}

	d := filepath.Join(dir, "example.com~broken")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, ".tmp"), []byte("#!/bin/sh\necho '{\"status\":\"Failure\",\"message\":\"no tools\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(d, ".tmp"), filepath.Join(d, "broken")); err != nil {
		t.Fatal(err)
	}
	c = next(t, got, "example.com/broken")
	if c.Plugin != nil || c.Err == nil || !strings.Contains(c.Err.Error(), "init command failed, status: Failure, reason: no tools") {
		t.Errorf("failing init: %+v, want its error", c)
	}
}

func TestProbeWaitsForAMissingDirectory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "volume", "exec")
	ds, err := New(Config{PluginDir: dir, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	got := runDrivers(t, ds)
	<-ds.Started()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the missing directory was created: %v", err)
	}
	// One step at a time: the parent, then the directory with a driver.
	if err := os.Mkdir(filepath.Join(parent, "volume"), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(parent, "volume", ".exec")
	writeDriver(t, tmp, "example.com/late", `{}`)
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
	if c := next(t, got, "example.com/late"); c.Plugin == nil {
		t.Errorf("driver in a directory that appeared: %+v, want a plugin", c)
	}
}

func TestReconstruct(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	writeDriver(t, dir, "example.com/nfs", `{"attach":false}`)
	writeDriver(t, dir, "example.com/ebs", `{}`)
	for _, p := range []string{"pods/uid-1/volumes/example.com~nfs/data", "pods/uid-2/volumes/example.com~ebs/pv-1",
		"plugins/kubernetes.io/flexvolume/example.com/ebs/mounts/pv-1"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := New(Config{PluginDir: dir, RootDir: root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	runDrivers(t, ds)
	<-ds.Started()
	mounted := filepath.Join(root, "pods/uid-2/volumes/example.com~ebs/pv-1")
	found := ds.Reconstruct(context.Background(), volume.Recovery{MountPoints: map[string]bool{mounted: true}})
	names := map[podvol.UniqueVolumeName]podvol.MountState{}
	for _, m := range found.Mounts {
		names[m.Spec.Name] = m.State
	}
	want := map[podvol.UniqueVolumeName]podvol.MountState{"example.com/nfs/uid-1-data": podvol.Uncertain, "example.com/ebs/pv-1": podvol.Mounted}
	if len(names) != 2 || names["example.com/nfs/uid-1-data"] != want["example.com/nfs/uid-1-data"] || names["example.com/ebs/pv-1"] != podvol.Mounted {
		t.Errorf("mounts found = %v, want %v", names, want)
	}
	if len(found.Devices) != 1 || found.Devices[0].Spec.Name != "example.com/ebs/pv-1" || found.Devices[0].State != podvol.Uncertain {
		t.Errorf("devices found = %+v, want the ebs device mount, Uncertain", found.Devices)
	}
}

// TestDriversObjects: every flexVolume pod volume with a secretRef holds
// its Secret, in the pod's namespace, whether or not its driver is there
// (volume.ObjectReader); others hold nothing.
func TestDriversObjects(t *testing.T) {
	ds, err := New(Config{PluginDir: t.TempDir(), RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	flex := func(secret string) *v1.Volume {
		f := &v1.FlexVolumeSource{Driver: "example.com/absent"}
		if secret != "-" {
			f.SecretRef = &v1.LocalObjectReference{Name: secret}
		}
		return &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{FlexVolume: f}}
	}
	tests := []struct {
		name string
		v    *v1.Volume
		want []objectcache.Ref
	}{
		{"secretRef", flex("creds"), []objectcache.Ref{{Kind: objectcache.Secret, Namespace: "ns", Name: "creds"}}},
		{"no secretRef", flex("-"), nil},
		{"empty secretRef", flex(""), nil},
		{"another kind", &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds"}}}, nil},
	}
	for _, tt := range tests {
		if got := ds.Objects("ns", tt.v); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Objects = %v, want %v", tt.name, got, tt.want)
		}
	}
}
