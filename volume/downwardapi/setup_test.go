package downwardapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// read returns "mode content" of each path of dir, as a container reads
// it (following the links).
func read(t *testing.T, dir string, paths ...string) string {
	t.Helper()
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %v %q", p, fi.Mode().Perm(), data))
	}
	return strings.Join(out, "\n")
}

// TestSetUp: the files of the items, with the kubelet's content and modes
// (the pod's fsGroup adds group read), on a tmpfs sized by the pod, the
// kubelet's ready file; a second SetUp changes nothing.
func TestSetUp(t *testing.T) {
	tp := newTestPlugin(t, nodeAlloc)
	ctx := context.Background()
	src := v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{
		field("labels", "metadata.labels"),
		field("app", "metadata.labels['app']"),
		field("meta/name", "metadata.name"),
		res("cpu/limit", "app", "limits.cpu", "1m"),
		res("mem", "app", "limits.memory", "1Mi"),
	}}
	src.Items[2].Mode = ptr[int32](0o400)
	for _, tc := range []struct {
		name    string
		fsGroup *int64
		want    string
	}{
		{"no fsGroup", nil, "labels -rw-r--r-- \"app=\\\"web\\\"\\ntier=\\\"front\\\"\"\n" +
			"app -rw-r--r-- \"web\"\nmeta/name -r-------- \"pod\"\ncpu/limit -rw-r--r-- \"250\"\nmem -rw-r--r-- \"256\""},
		{"fsGroup: group read", ptr(int64(os.Getgid())), "labels -rw-r--r-- \"app=\\\"web\\\"\\ntier=\\\"front\\\"\"\n" +
			"app -rw-r--r-- \"web\"\nmeta/name -r--r----- \"pod\"\ncpu/limit -rw-r--r-- \"250\"\nmem -rw-r--r-- \"256\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := resolved(t, tp.plugin, testPod(map[string]string{"app": "web", "tier": "front"}), tc.name, src)
			dir, err := tp.SetUp(ctx, request(spec, tc.name, tc.fsGroup))
			if err != nil {
				t.Fatal(err)
			}
			if want := volumeDir(tp.root, tc.name); dir != want {
				t.Fatalf("SetUp at %s, want %s", dir, want)
			}
			if got := read(t, dir, "labels", "app", "meta/name", "cpu/limit", "mem"); got != tc.want {
				t.Errorf("files:\n%s\nwant:\n%s", got, tc.want)
			}
			if got, want := listing(t, dir), "app -> ..data/app -rw-r--r-- web\ncpu -> ..data/cpu\nlabels -> ..data/labels -rw-r--r-- app=\"web\"\ntier=\"front\"\n"+
				"mem -> ..data/mem -rw-r--r-- 256\nmeta -> ..data/meta"; got != want {
				t.Errorf("links:\n%s\nwant:\n%s", got, want)
			}
			if !objtest.Exists(t, readyPath(tp.root, tc.name)) {
				t.Error("no ready file")
			}
			var tmpfs bool
			mps, _ := tp.fake.List()
			for _, m := range mps {
				if m.Path == dir && m.Type == "tmpfs" && slices.Contains(m.Opts, "size=268435456") {
					tmpfs = true
				}
			}
			if !tmpfs {
				t.Errorf("no tmpfs of the pod's memory limit at %s: %+v", dir, mps)
			}
			steps, log := len(tp.steps), len(tp.fake.GetLog())
			if _, err := tp.SetUp(ctx, request(spec, tc.name, tc.fsGroup)); err != nil {
				t.Fatal(err)
			}
			if len(tp.steps) != steps || len(tp.fake.GetLog()) != log {
				t.Errorf("a second SetUp changed something: steps %v, mounter log %v", tp.steps[steps:], tp.fake.GetLog()[log:])
			}
		})
	}
}

// TestLabelChange: a label change is a change of the resolved spec, and
// its SetUp switches ..data to a new version holding the new labels file;
// the old version is not written to; the other files read the same.
func TestLabelChange(t *testing.T) {
	tp := newTestPlugin(t, nodeAlloc)
	ctx := context.Background()
	src := v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{
		field("labels", "metadata.labels"), field("name", "metadata.name"),
	}}
	before := resolved(t, tp.plugin, testPod(map[string]string{"app": "web"}), "info", src)
	dir, err := tp.SetUp(ctx, request(before, "info", nil))
	if err != nil {
		t.Fatal(err)
	}
	oldVersion, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	same := resolved(t, tp.plugin, testPod(map[string]string{"app": "web"}), "info", src)
	after := resolved(t, tp.plugin, testPod(map[string]string{"app": "web", "v": "2"}), "info", src)
	if !equalAttrs(before.Attributes, same.Attributes) || equalAttrs(before.Attributes, after.Attributes) {
		t.Fatalf("attributes: same pod %v, new labels %v; want equal, then different", same.Attributes, after.Attributes)
	}
	steps := len(tp.steps)
	if _, err := tp.SetUp(ctx, request(after, "info", nil)); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, dir, "labels", "name"), "labels -rw-r--r-- \"app=\\\"web\\\"\\nv=\\\"2\\\"\"\nname -rw-r--r-- \"pod\""; got != want {
		t.Errorf("after the change:\n%s\nwant:\n%s", got, want)
	}
	newVersion, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil || newVersion == oldVersion {
		t.Fatalf("..data -> %s (%v), was %s: want a new version", newVersion, err, oldVersion)
	}
	if data, err := os.ReadFile(filepath.Join(dir, oldVersion, "labels")); err != nil || string(data) != `app="web"` {
		t.Errorf("the old version's labels file: %q, %v; want it untouched", data, err)
	}
	var switched bool
	for _, s := range tp.steps[steps:] {
		if strings.HasPrefix(s.Path, filepath.Join(dir, oldVersion)) && s.Op != step.Remove {
			t.Errorf("the update changed the old version: %v", s)
		}
		if s.Op == step.Rename && s.Path == filepath.Join(dir, "..data") {
			switched = true
		}
		if s.Op == step.Mount || s.Op == step.Unmount {
			t.Errorf("the update mounted: %v", s)
		}
	}
	if !switched {
		t.Errorf("no rename over ..data among the update's steps: %v", tp.steps[steps:])
	}
}

func equalAttrs(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestResolveErrors: what the kubelet fails on fails the resolution,
// naming pod, volume and cause, with its text; a node that cannot be read
// is not the pod's fault.
func TestResolveErrors(t *testing.T) {
	noNode := func() (v1.ResourceList, error) { return nil, errors.New("node not synced") }
	for _, tc := range []struct {
		name     string
		alloc    func() (v1.ResourceList, error)
		items    []v1.DownwardAPIVolumeFile
		noSource bool
		want     string
		notReady bool
	}{
		{name: "unsupported field", items: []v1.DownwardAPIVolumeFile{field("n", "spec.nodeName")},
			want: "unsupported fieldPath: spec.nodeName"},
		{name: "unknown container", items: []v1.DownwardAPIVolumeFile{res("c", "nope", "limits.cpu", "1")},
			want: "container nope not found"},
		{name: "path leaving the volume", items: []v1.DownwardAPIVolumeFile{field("../x", "metadata.name")},
			want: "invalid path: must not contain '..': ../x"},
		{name: "absolute path", items: []v1.DownwardAPIVolumeFile{field("/etc/x", "metadata.name")},
			want: "invalid path: must be relative path: /etc/x"},
		{name: "reserved name", items: []v1.DownwardAPIVolumeFile{field("..data", "metadata.name")},
			want: "invalid path: must not start with '..': ..data"},
		{name: "a file below a file", items: []v1.DownwardAPIVolumeFile{field("a", "metadata.name"), field("a/b", "metadata.uid")},
			want: "invalid path: a is a file, so a/b cannot be written below it"},
		{name: "node not known", alloc: noNode, items: []v1.DownwardAPIVolumeFile{res("c", "app", "limits.cpu", "1")},
			want: "error retrieving node: node not synced", notReady: true},
		{name: "no source", noSource: true, want: "the spec has no downwardAPI source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPlugin(t, tc.alloc)
			spec := unresolved("v", v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: tc.items})
			if tc.noSource {
				spec.Source = &v1.VolumeSource{}
			}
			err := tp.ResolveSpec(testPod(nil), spec)
			prefix := "downwardAPI volume " + string(spec.Name) + " of pod ns/pod: "
			if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.want) || errors.Is(err, volume.ErrNotReady) != tc.notReady {
				t.Fatalf("ResolveSpec = %v; want %s%s (not ready: %v)", err, prefix, tc.want, tc.notReady)
			}
			if spec.Attributes != nil {
				t.Errorf("a failed resolution set attributes %v", spec.Attributes)
			}
		})
	}
}

// TestNodeNotNeeded: a volume whose items read no resources reads the node
// only for its tmpfs bound; a node that cannot be read makes it wait
// (ErrNotReady), as the kubelet's wrapped emptyDir fails then.
func TestNodeNotNeeded(t *testing.T) {
	calls := 0
	tp := newTestPlugin(t, func() (v1.ResourceList, error) { calls++; return nil, errors.New("node not synced") })
	spec := unresolved("v", v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{field("n", "metadata.name")}})
	err := tp.ResolveSpec(testPod(nil), spec)
	if !errors.Is(err, volume.ErrNotReady) || calls != 1 {
		t.Fatalf("ResolveSpec = %v, node read %d times; want ErrNotReady, one read (the tmpfs bound)", err, calls)
	}
}

// TestSetUpErrors: a spec that was not resolved is refused before anything
// is made; a write that fails once the tmpfs is set up is uncertain and
// leaves the old files.
func TestSetUpErrors(t *testing.T) {
	tp := newTestPlugin(t, nodeAlloc)
	ctx := context.Background()
	_, err := tp.SetUp(ctx, request(unresolved("v", v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644)}), "v", nil))
	if err == nil || !strings.Contains(err.Error(), "not resolved") || len(tp.steps) != 0 {
		t.Fatalf("unresolved spec: %v, steps %v", err, tp.steps)
	}
	src := v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{field("labels", "metadata.labels")}}
	dir, err := tp.SetUp(ctx, request(resolved(t, tp.plugin, testPod(map[string]string{"a": "1"}), "v", src), "v", nil))
	if err != nil {
		t.Fatal(err)
	}
	newer := resolved(t, tp.plugin, testPod(map[string]string{"a": "2"}), "v", src)
	failing := errors.New("disk full")
	tp.steps = nil
	tp.plugin.Steps = func(s step.Step) error {
		if s.Op == step.Rename {
			return failing
		}
		return nil
	}
	_, err = tp.SetUp(ctx, request(newer, "v", nil))
	if !errors.Is(err, failing) || !volume.IsUncertain(err) || !strings.Contains(err.Error(), `downwardAPI volume "v" of pod ns/pod`) {
		t.Fatalf("failed write: %v; want it uncertain, naming the volume and the cause", err)
	}
	if got := read(t, dir, "labels"); got != `labels -rw-r--r-- "a=\"1\""` {
		t.Errorf("after a failed update: %s; want the old file", got)
	}
	tp.plugin.Steps = nil
	if _, err := tp.SetUp(ctx, request(newer, "v", nil)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, dir, "labels"); got != `labels -rw-r--r-- "a=\"2\""` {
		t.Errorf("after the retry: %s", got)
	}
}

// TestTearDownAndReconstruct: a volume found after a restart under the
// kubelet's name, torn down from its path alone, twice.
func TestTearDownAndReconstruct(t *testing.T) {
	tp := newTestPlugin(t, nodeAlloc)
	ctx := context.Background()
	spec := resolved(t, tp.plugin, testPod(nil), "info", v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{field("n", "metadata.name")}})
	dir, err := tp.SetUp(ctx, request(spec, "info", nil))
	if err != nil {
		t.Fatal(err)
	}
	again, err := newPlugin(Config{RootDir: tp.root, Mounter: tp.fake})
	if err != nil {
		t.Fatal(err)
	}
	found := again.Reconstruct(ctx, volume.Recovery{MountPoints: map[string]bool{dir: true}})
	if len(found.Mounts) != 1 {
		t.Fatalf("Reconstruct = %+v", found)
	}
	m := found.Mounts[0]
	if m.Spec.Name != spec.Name || m.Spec.Plugin != PluginName || !m.Spec.Ephemeral || m.Volume.Pod.UID != testUID || m.Volume.SpecName != "info" || m.Path != dir || m.State != podvol.Uncertain {
		t.Fatalf("found %+v", m)
	}
	for range 2 {
		if err := again.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
			t.Fatal(err)
		}
	}
	if mps, _ := tp.fake.List(); len(mps) != 0 || objtest.Exists(t, dir) || objtest.Exists(t, filepath.Dir(readyPath(tp.root, "info"))) {
		t.Fatalf("after TearDown: mounts %v, directory there %v", mps, objtest.Exists(t, dir))
	}
}

// TestEncoding: what ResolveSpec stores is what SetUp reads back, owners
// included.
func TestEncoding(t *testing.T) {
	tp := newTestPlugin(t, nodeAlloc)
	tp.userFields = true
	src := v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o640), DefaultUser: ptr[int64](1000), Items: []v1.DownwardAPIVolumeFile{
		field("a/n", "metadata.name"), field("empty", "metadata.labels"), field("u", "metadata.uid"),
	}}
	src.Items[2].User, src.Items[2].Mode = ptr[int64](7), ptr[int32](0o400)
	spec := resolved(t, tp.plugin, testPod(nil), "v", src)
	want := map[string]string{"resolved": "true", "sizeBytes": "268435456",
		"file:a/n": "pod", "mode:a/n": "640", "user:a/n": "1000",
		"file:empty": "", "mode:empty": "640", "user:empty": "1000",
		"file:u": string(testUID), "mode:u": "400", "user:u": "7"}
	if !equalAttrs(spec.Attributes, want) {
		t.Fatalf("attributes %v\nwant %v", spec.Attributes, want)
	}
	payload, size, err := decode(spec.Attributes)
	if err != nil || size != 256<<20 || len(payload) != 3 || string(payload["a/n"].Data) != "pod" || payload["u"].Mode != 0o400 || *payload["u"].FSUser != 7 || *payload["empty"].FSUser != 1000 {
		t.Fatalf("decode = %v, %d, %v", payload, size, err)
	}
	for _, bad := range []map[string]string{
		{},
		{"resolved": "true", "sizeBytes": "-1"},
		{"resolved": "true", "file:x": "1", "mode:x": "9"},
		{"resolved": "true", "file:x": "1", "mode:x": "644", "user:x": "me"},
	} {
		if _, _, err := decode(bad); err == nil {
			t.Errorf("decode(%v): no error", bad)
		}
	}
}
