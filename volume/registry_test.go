package volume

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
)

// fakePlugin claims the pod volumes claim says yes to.
type fakePlugin struct {
	name  string
	claim func(v *v1.Volume) bool
}

func (f fakePlugin) Name() string                 { return f.name }
func (f fakePlugin) CanSupport(v *v1.Volume) bool { return f.claim(v) }
func (f fakePlugin) Capabilities(*podvol.VolumeSpec) (Capabilities, error) {
	return Capabilities{}, nil
}
func (f fakePlugin) SetUp(context.Context, MountRequest) (string, error) { return "", nil }
func (f fakePlugin) TearDown(context.Context, MountRequest) error        { return nil }

func emptyDirs(v *v1.Volume) bool { return v.EmptyDir != nil }
func hostPaths(v *v1.Volume) bool { return v.HostPath != nil }

func TestRegisterRefusesClashingNames(t *testing.T) {
	tests := []struct {
		name    string
		plugins []Plugin
		want    string // "" for no error
	}{
		{"distinct names", []Plugin{fakePlugin{"example.com/a", emptyDirs}, fakePlugin{"example.com/b", hostPaths}}, ""},
		{"a common prefix that is not a whole path element", []Plugin{fakePlugin{"example.com/a", emptyDirs}, fakePlugin{"example.com/ab", hostPaths}}, ""},
		{"the same name twice", []Plugin{fakePlugin{"example.com/a", emptyDirs}, fakePlugin{"example.com/a", hostPaths}}, "clashes with plugin example.com/a"},
		{"a name below another", []Plugin{fakePlugin{"example.com/a", emptyDirs}, fakePlugin{"example.com/a/b", hostPaths}}, "clashes with plugin example.com/a"},
		{"a name above another", []Plugin{fakePlugin{"example.com/a/b", emptyDirs}, fakePlugin{"example.com/a", hostPaths}}, "clashes with plugin example.com/a/b"},
		{"no name", []Plugin{fakePlugin{"", emptyDirs}}, "empty name"},
		{"nil", []Plugin{nil}, "nil plugin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewRegistry(tt.plugins...)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("NewRegistry = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestForSource(t *testing.T) {
	r, err := NewRegistry(fakePlugin{"example.com/empty", emptyDirs}, fakePlugin{"example.com/host", hostPaths})
	if err != nil {
		t.Fatal(err)
	}
	vol := func(name string, src v1.VolumeSource) *v1.Volume { return &v1.Volume{Name: name, VolumeSource: src} }
	p, err := r.ForSource(vol("scratch", v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}))
	if err != nil || p.Name() != "example.com/empty" {
		t.Errorf("ForSource(emptyDir) = %v, %v; want example.com/empty", p, err)
	}
	_, err = r.ForSource(vol("cfg", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}))
	const want = `volume "cfg" of kind configMap: no volume plugin handles it (registered: example.com/empty, example.com/host)`
	if err == nil || err.Error() != want || !errors.Is(err, ErrNoPlugin) {
		t.Errorf("ForSource(configMap) = %v, want %q wrapping ErrNoPlugin", err, want)
	}
	if _, err := r.ForSource(vol("nothing", v1.VolumeSource{})); err == nil || !strings.Contains(err.Error(), `volume "nothing" of kind no source`) {
		t.Errorf("ForSource(no source) = %v", err)
	}

	if err := r.Register(fakePlugin{"example.com/greedy", func(*v1.Volume) bool { return true }}); err != nil {
		t.Fatal(err)
	}
	_, err = r.ForSource(vol("scratch", v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}))
	const twice = `volume "scratch" of kind emptyDir: claimed by more than one volume plugin (example.com/empty, example.com/greedy)`
	if err == nil || err.Error() != twice || errors.Is(err, ErrNoPlugin) {
		t.Errorf("ForSource with two claimants = %v, want %q", err, twice)
	}
}

func TestForVolume(t *testing.T) {
	r, err := NewRegistry(fakePlugin{"example.com/a", emptyDirs}, fakePlugin{"example.com/ab", hostPaths})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[podvol.UniqueVolumeName]string{
		"example.com/a/uid-data":  "example.com/a",
		"example.com/ab/uid-data": "example.com/ab",
	} {
		if p, err := r.ForVolume(name); err != nil || p.Name() != want {
			t.Errorf("ForVolume(%s) = %v, %v; want %s", name, p, err, want)
		}
	}
	for _, name := range []podvol.UniqueVolumeName{"example.com/abc/x", "example.com/a", "vol"} {
		if _, err := r.ForVolume(name); !errors.Is(err, ErrNoPlugin) || !strings.Contains(err.Error(), "volume "+string(name)+": ") {
			t.Errorf("ForVolume(%s) = %v, want ErrNoPlugin naming the volume", name, err)
		}
	}
}

// TestOfPlugin: a volume is a plugin's when the plugin's name and a slash
// start its name, as ForVolume finds it, registered or not.
func TestOfPlugin(t *testing.T) {
	tests := []struct {
		name   podvol.UniqueVolumeName
		plugin string
		want   bool
	}{
		{"example.com/a/uid-data", "example.com/a", true},
		{"example.com/ab/uid-data", "example.com/a", false},
		{"example.com/a", "example.com/a", false},
		{"example.com/a/", "example.com/a", true},
		{"kubernetes.io/csi/d^h", "kubernetes.io/csi", true},
		{"vol", "example.com/a", false},
	}
	for _, tt := range tests {
		if got := OfPlugin(tt.name, tt.plugin); got != tt.want {
			t.Errorf("OfPlugin(%s, %s) = %v, want %v", tt.name, tt.plugin, got, tt.want)
		}
	}
}

func TestSourceKind(t *testing.T) {
	for want, src := range map[string]v1.VolumeSource{
		"persistentVolumeClaim": {PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{}},
		"csi":                   {CSI: &v1.CSIVolumeSource{}},
		"ephemeral":             {Ephemeral: &v1.EphemeralVolumeSource{}},
		"image":                 {Image: &v1.ImageVolumeSource{}},
		"gcePersistentDisk":     {GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{}},
		"no source":             {},
	} {
		if got := SourceKind(&src); got != want {
			t.Errorf("SourceKind = %q, want %q", got, want)
		}
	}
}

func TestInUseError(t *testing.T) {
	err := fmt.Errorf("unstaging: %w", &InUseError{Path: "/stage", Refs: []string{"/pods/a/mount"}})
	var iu *InUseError
	if !errors.Is(err, ErrInUse) || !errors.As(err, &iu) || iu.Refs[0] != "/pods/a/mount" {
		t.Fatalf("%v: Is(ErrInUse)=%v", err, errors.Is(err, ErrInUse))
	}
	if IsUncertain(err) || !IsUncertain(fmt.Errorf("rpc: %w", ErrInProgress)) {
		t.Error("IsUncertain holds for exactly the errors wrapping ErrInProgress")
	}
}

// TestCheckSources: two plugins that claim the same kind of source are an
// error naming the kind and both; plugins of distinct kinds are not.
func TestCheckSources(t *testing.T) {
	nfs := func(v *v1.Volume) bool { return v.NFS != nil }
	tests := []struct {
		name    string
		plugins []Plugin
		want    string // "" for no error
	}{
		{"distinct kinds", []Plugin{fakePlugin{"example.com/empty", emptyDirs}, fakePlugin{"example.com/nfs", nfs}}, ""},
		{"none", nil, ""},
		{"one kind twice", []Plugin{fakePlugin{"example.com/nfs", nfs}, fakePlugin{"example.com/nfs2", nfs}},
			"pod volumes of kind nfs are claimed by more than one volume plugin (example.com/nfs, example.com/nfs2)"},
		{"a plugin claiming everything", []Plugin{fakePlugin{"example.com/empty", emptyDirs}, fakePlugin{"example.com/greedy", func(*v1.Volume) bool { return true }}},
			"pod volumes of kind emptyDir are claimed by more than one volume plugin (example.com/empty, example.com/greedy)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRegistry(tt.plugins...)
			if err != nil {
				t.Fatal(err)
			}
			err = r.CheckSources()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || err.Error() != tt.want) {
				t.Errorf("CheckSources = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestReplaceAndUnregister(t *testing.T) {
	first := fakePlugin{"example.com/a", emptyDirs}
	r, err := NewRegistry(first, fakePlugin{"example.com/b", hostPaths})
	if err != nil {
		t.Fatal(err)
	}
	name := podvol.UniqueVolumeName("example.com/a/vol")
	second := fakePlugin{"example.com/a", hostPaths}
	if err := r.Replace(second); err != nil {
		t.Fatalf("Replace of a registered name: %v", err)
	}
	if p, err := r.ForVolume(name); err != nil || !p.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{}}}) {
		t.Errorf("ForVolume after Replace = %v, %v; want the new plugin", p, err)
	}
	if err := r.Replace(fakePlugin{"example.com/a/c", hostPaths}); err == nil {
		t.Error("Replace of a clashing new name succeeded")
	}
	if err := r.Replace(fakePlugin{"example.com/c", emptyDirs}); err != nil {
		t.Errorf("Replace of a new name: %v", err)
	}
	r.Unregister("example.com/a")
	r.Unregister("example.com/none")
	if _, err := r.ForVolume(name); !errors.Is(err, ErrNoPlugin) {
		t.Errorf("ForVolume after Unregister = %v, want ErrNoPlugin", err)
	}
	if err := r.Register(first); err != nil {
		t.Errorf("Register after Unregister: %v", err)
	}
}
