package hostpath

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

func newPlugin(t *testing.T, hook step.Hook) volume.Plugin {
	t.Helper()
	p, err := New(Config{Steps: hook})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hostPathSource(path string, typ v1.HostPathType) *v1.HostPathVolumeSource {
	src := &v1.HostPathVolumeSource{Path: path}
	if typ != "" {
		src.Type = &typ
	}
	return src
}

var testPod = &v1.Pod{
	ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-1"},
	Spec: v1.PodSpec{Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"},
	}}}},
}

// podSpec is the spec the volume manager builds for pod volume name.
func podSpec(name string, src *v1.HostPathVolumeSource) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{
		Name:      podvol.UniqueVolumeName(PluginName + "/uid-1-" + name),
		Plugin:    PluginName,
		Mode:      podvol.Filesystem,
		Ephemeral: true,
		Source:    &v1.VolumeSource{HostPath: src},
	}
}

// pvSpec is the spec the volume manager builds for a PV.
func pvSpec(pv string, src *v1.HostPathVolumeSource, mode podvol.VolumeMode) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{
		Name:      podvol.UniqueVolumeName(PluginName + "/uid-1-" + pv),
		Plugin:    PluginName,
		PVName:    pv,
		Claim:     "ns/claim",
		Mode:      mode,
		Ephemeral: true,
		PVSource:  &v1.PersistentVolumeSource{HostPath: src},
	}
}

func TestCanSupport(t *testing.T) {
	p := newPlugin(t, nil)
	if p.Name() != "kubernetes.io/host-path" {
		t.Errorf("Name = %q", p.Name())
	}
	for _, tt := range []struct {
		v    *v1.Volume
		want bool
	}{
		{&v1.Volume{Name: "logs", VolumeSource: v1.VolumeSource{HostPath: hostPathSource("/var/log", "")}}, true},
		{nil, false},
		{&v1.Volume{Name: "none"}, false},
		{&v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, false},
		{&v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}, false},
	} {
		if got := p.CanSupport(tt.v); got != tt.want {
			t.Errorf("CanSupport(%+v) = %v, want %v", tt.v, got, tt.want)
		}
	}
	pvp, ok := p.(volume.PVPlugin)
	if !ok {
		t.Fatal("the hostPath plugin is not a PVPlugin")
	}
	for _, tt := range []struct {
		pv   *v1.PersistentVolume
		want bool
	}{
		{&v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{HostPath: hostPathSource("/srv", "")}}}, true},
		{nil, false},
		{&v1.PersistentVolume{}, false},
		{&v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/srv"}}}}, false},
	} {
		if got := pvp.CanSupportPV(tt.pv); got != tt.want {
			t.Errorf("CanSupportPV(%+v) = %v, want %v", tt.pv, got, tt.want)
		}
	}
}

// TestContract: what the planner reads and what the executor may call.
func TestContract(t *testing.T) {
	p := newPlugin(t, nil)
	caps, err := p.Capabilities(podSpec("logs", hostPathSource("/var/log", "")))
	if err != nil || !reflect.DeepEqual(caps, volume.Capabilities{}) {
		t.Errorf("Capabilities = %+v, %v; want none", caps, err)
	}
	if _, ok := p.(volume.SpecResolver); !ok {
		t.Error("the hostPath plugin resolves no spec")
	}
	for name, ok := range map[string]bool{
		"Attacher":      is[volume.Attacher](p),
		"SelfAttacher":  is[volume.SelfAttacher](p),
		"DeviceMounter": is[volume.DeviceMounter](p),
		"Expander":      is[volume.Expander](p),
		"StatsProvider": is[volume.StatsProvider](p),
		// Nothing is left under the kubelet's root to find again.
		"Reconstructor": is[volume.Reconstructor](p),
	} {
		if ok {
			t.Errorf("the hostPath plugin is a %s", name)
		}
	}
	r, err := volume.NewRegistry(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.ForVolume(podSpec("logs", nil).Name); err != nil || got != p {
		t.Errorf("ForVolume = %v, %v", got, err)
	}
}

func is[T any](p volume.Plugin) bool { _, ok := p.(T); return ok }

// TestResolveSpec: a source the kubelet would never set up is refused for
// good, with the pod, the volume, the path and the cause.
func TestResolveSpec(t *testing.T) {
	tests := []struct {
		name string
		spec *podvol.VolumeSpec
		want string // the error, "" for none
	}{
		{"unset type", podSpec("logs", hostPathSource("/var/log", "")), ""},
		{"every known type", nil, ""},
		{"PV", pvSpec("pv-1", hostPathSource("/srv/data", v1.HostPathDirectoryOrCreate), podvol.Filesystem), ""},
		{"dots in a name", podSpec("logs", hostPathSource("/var/..log/x..", "")), ""},
		{"a dot", podSpec("logs", hostPathSource("/var/./log", "")), ""},
		{"no path", podSpec("logs", hostPathSource("", "")),
			`hostPath volume "logs" of pod ns/web, path "": no path`},
		{"relative path", podSpec("logs", hostPathSource("var/log", "")),
			`hostPath volume "logs" of pod ns/web, path "var/log": the path must be absolute`},
		{"backstep", podSpec("logs", hostPathSource("/var/../etc", "")),
			`hostPath volume "logs" of pod ns/web, path "/var/../etc": must not contain '..'`},
		{"trailing backstep", podSpec("logs", hostPathSource("/var/log/..", "")),
			`hostPath volume "logs" of pod ns/web, path "/var/log/..": must not contain '..'`},
		{"PV backstep", pvSpec("pv-1", hostPathSource("/srv/../etc", ""), podvol.Filesystem),
			`hostPath volume "data" (PV pv-1) of pod ns/web, path "/srv/../etc": must not contain '..'`},
		{"PV of another claim", func() *podvol.VolumeSpec {
			s := pvSpec("pv-2", hostPathSource("", ""), podvol.Filesystem)
			s.Claim = "ns/other"
			return s
		}(), `hostPath PV pv-2 of pod ns/web, path "": no path`},
		{"unknown type", podSpec("logs", hostPathSource("/var/log", "Pipe")),
			`hostPath volume "logs" of pod ns/web, path "/var/log": unknown type "Pipe" (known: "", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")`},
		{"block PV", pvSpec("pv-1", hostPathSource("/dev/sdb", v1.HostPathBlockDev), podvol.Block),
			`hostPath volume "data" (PV pv-1) of pod ns/web, path "/dev/sdb": a hostPath volume cannot be used as a raw block device (volumeMode Block)`},
		{"no source", &podvol.VolumeSpec{Name: PluginName + "/uid-1-logs", Plugin: PluginName},
			`hostPath volume "logs" of pod ns/web: no hostPath source`},
	}
	p := newPlugin(t, nil).(volume.SpecResolver)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs := []*podvol.VolumeSpec{tt.spec}
			if tt.spec == nil {
				specs = nil
				for _, typ := range knownTypes {
					specs = append(specs, podSpec("logs", hostPathSource("/var/log", typ)))
				}
			}
			for _, spec := range specs {
				err := p.ResolveSpec(testPod, spec)
				switch {
				case tt.want == "" && err != nil:
					t.Errorf("ResolveSpec = %v", err)
				case tt.want != "" && (err == nil || err.Error() != tt.want):
					t.Errorf("ResolveSpec = %v, want %s", err, tt.want)
				}
				if spec.Attributes != nil {
					t.Errorf("ResolveSpec set attributes %v", spec.Attributes)
				}
			}
		})
	}
}

// TestSetUp: SetUp checks the pod volume's or the PV's source and returns
// the host path itself, whatever the pod's read-only flag; a mismatch is
// retryable (never Uncertain) and names the pod, the volume, the type and
// what was found, and its cause in the kubelet's words (what a pod's
// event says: volume.EventCause) is the kubelet's error alone; TearDown
// has nothing to do, even with no source.
func TestSetUp(t *testing.T) {
	dir := hostTree(t)
	ctx := context.Background()
	ref := podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "web"}
	tests := []struct {
		name     string
		spec     *podvol.VolumeSpec
		readOnly bool
		want     string // the error, "" for none; %s is the tree
		cause    string // its kubelet's words, where they are not want's
	}{
		{"pod volume", podSpec("logs", hostPathSource(dir+"/d", v1.HostPathDirectory)), false, "", ""},
		{"read-only", podSpec("logs", hostPathSource(dir+"/d", v1.HostPathDirectory)), true, "", ""},
		{"unset type on nothing", podSpec("logs", hostPathSource(dir+"/missing", "")), false, "", ""},
		{"PV", pvSpec("pv-1", hostPathSource(dir+"/f", v1.HostPathFile), podvol.Filesystem), false, "", ""},
		{"PV creates its directory", pvSpec("pv-1", hostPathSource(dir+"/new", v1.HostPathDirectoryOrCreate), podvol.Filesystem), false, "", ""},
		{"mismatch", podSpec("logs", hostPathSource(dir+"/f", v1.HostPathDirectory)), false,
			`setting up hostPath volume "logs" of pod ns/web (type Directory): hostPath type check failed: %[1]s/f is not a directory, it's a File`,
			`hostPath type check failed: %[1]s/f is not a directory, it's a File`},
		{"PV mismatch", pvSpec("pv-1", hostPathSource(dir+"/d", v1.HostPathSocket), podvol.Filesystem), false,
			`setting up hostPath volume "logs" (PV pv-1) of pod ns/web (type Socket): hostPath type check failed: %[1]s/d is not a socket file, it's a Directory`,
			`hostPath type check failed: %[1]s/d is not a socket file, it's a Directory`},
		{"missing", podSpec("logs", hostPathSource(dir+"/gone", v1.HostPathFile)), false,
			`setting up hostPath volume "logs" of pod ns/web (type File): hostPath type check failed, %[1]s/gone is not a file, unable to determine its type: path "%[1]s/gone" does not exist`,
			`hostPath type check failed, %[1]s/gone is not a file, unable to determine its type: path "%[1]s/gone" does not exist`},
		{"backstep", podSpec("logs", hostPathSource(dir+"/../d", v1.HostPathDirectory)), false,
			"setting up hostPath volume \"logs\" of pod ns/web: invalid HostPath `%[1]s/../d`: must not contain '..'",
			"invalid HostPath `%[1]s/../d`: must not contain '..'"},
		{"no source", &podvol.VolumeSpec{Name: PluginName + "/uid-1-logs"}, false,
			`setting up hostPath volume "logs" of pod ns/web: no hostPath source`, ""},
	}
	p := newPlugin(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := volume.MountRequest{Spec: tt.spec, Volume: podvol.PodVolume{Pod: ref, SpecName: "logs", ReadOnly: tt.readOnly}}
			path, err := p.SetUp(ctx, req)
			if tt.want != "" {
				want := strings.ReplaceAll(tt.want, "%[1]s", dir)
				if err == nil || err.Error() != want {
					t.Fatalf("SetUp = %q, %v; want %s", path, err, want)
				}
				if volume.IsUncertain(err) || path != "" {
					t.Errorf("SetUp = %q, %v: a failed type check is neither Uncertain nor a path", path, err)
				}
				cause := want // no kubelet's words: the error's own
				if tt.cause != "" {
					cause = strings.ReplaceAll(tt.cause, "%[1]s", dir)
				}
				if _, got := volume.EventCause(err); got != cause {
					t.Errorf("EventCause = %q, want %q", got, cause)
				}
				return
			}
			if err != nil || path != sourceOf(tt.spec).Path {
				t.Fatalf("SetUp = %q, %v; want %s", path, err, sourceOf(tt.spec).Path)
			}
			if err := p.TearDown(ctx, req); err != nil {
				t.Errorf("TearDown = %v", err)
			}
		})
	}
	if fi, err := os.Stat(filepath.Join(dir, "new")); err != nil || !fi.IsDir() {
		t.Errorf("the PV's DirectoryOrCreate made nothing: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unset type made something: %v", err)
	}
	// A volume found on disk for a pod that is gone: no spec at all.
	if err := p.TearDown(ctx, volume.MountRequest{Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "gone"}, SpecName: "logs"}}); err != nil {
		t.Errorf("TearDown without a spec = %v", err)
	}
}

// TestSetUpRetry: a path that is not there yet fails SetUp, and the same
// SetUp succeeds once it appears: the kubelet's retry.
func TestSetUpRetry(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	p := newPlugin(t, nil)
	req := volume.MountRequest{Spec: podSpec("agent", hostPathSource(sock, v1.HostPathSocket)), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "web"}, SpecName: "agent"}}
	if _, err := p.SetUp(context.Background(), req); err == nil || volume.IsUncertain(err) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("SetUp before the socket = %v, want a retryable not-exist error", err)
	}
	hostTreeSocket(t, sock)
	if path, err := p.SetUp(context.Background(), req); err != nil || path != sock {
		t.Fatalf("SetUp once the socket is there = %q, %v", path, err)
	}
}

// TestSetUpSteps: DirectoryOrCreate's directories reach the step hook with
// their paths, and a refused step fails SetUp, not Uncertain.
func TestSetUpSteps(t *testing.T) {
	dir := t.TempDir()
	var seen []step.Step
	refuse := errors.New("refused")
	p := newPlugin(t, func(s step.Step) error {
		seen = append(seen, s)
		if strings.HasSuffix(s.Path, "/b") {
			return refuse
		}
		return nil
	})
	req := volume.MountRequest{Spec: podSpec("data", hostPathSource(dir+"/a/b", v1.HostPathDirectoryOrCreate)), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1"}, SpecName: "data"}}
	_, err := p.SetUp(context.Background(), req)
	if !errors.Is(err, refuse) || volume.IsUncertain(err) {
		t.Fatalf("SetUp with the step refused = %v", err)
	}
	want := []step.Step{{Op: step.Mkdir, Path: dir + "/a"}, {Op: step.Mkdir, Path: dir + "/a/b"}}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("steps %v, want %v", seen, want)
	}
}

func TestSetUpCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	p := newPlugin(t, nil)
	req := volume.MountRequest{Spec: podSpec("data", hostPathSource(dir+"/new", v1.HostPathDirectoryOrCreate)), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1"}, SpecName: "data"}}
	if _, err := p.SetUp(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("SetUp canceled = %v", err)
	}
	if _, err := os.Lstat(dir + "/new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a canceled SetUp made the directory: %v", err)
	}
}
