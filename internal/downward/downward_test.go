package downward

import (
	"maps"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodevol/nodevol/internal/atomicwriter"
)

func ptr[T any](v T) *T { return &v }

func rl(kv ...string) v1.ResourceList {
	out := v1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func testPod() *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "sidecar", RestartPolicy: ptr(v1.ContainerRestartPolicyAlways),
			Resources: v1.ResourceRequirements{Limits: rl("cpu", "1500m")}}},
		Containers: []v1.Container{
			{Name: "app", Resources: v1.ResourceRequirements{
				Limits:   rl("cpu", "250m", "memory", "64Mi", "hugepages-2Mi", "4Mi", "ephemeral-storage", "0"),
				Requests: rl("cpu", "100m", "memory", "32Mi", "ephemeral-storage", "1536Mi", "hugepages-2Mi", "4Mi"),
			}},
			{Name: "bare"},
		},
	}}
	p.Name, p.Namespace, p.UID = "web-0", "shop", "0a1b2c3d-0000-4000-8000-000000000001"
	p.Labels = map[string]string{"tier": "front", "app": `say "hi"`, "z": "é\ttab"}
	p.Annotations = map[string]string{"Example.com/Owner": "team-a", "note": "line1\nline2"}
	return p
}

func field(path, fieldPath string) v1.DownwardAPIVolumeFile {
	return v1.DownwardAPIVolumeFile{Path: path, FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath}}
}

func res(path, container, name, divisor string) v1.DownwardAPIVolumeFile {
	sel := &v1.ResourceFieldSelector{ContainerName: container, Resource: name}
	if divisor != "" {
		sel.Divisor = resource.MustParse(divisor)
	}
	return v1.DownwardAPIVolumeFile{Path: path, ResourceFieldRef: sel}
}

// node is the node's allocatable resources in the tests.
var node = rl("cpu", "4", "memory", "8Gi", "ephemeral-storage", "10Gi", "pods", "110")

// TestValues: the content of each file is what the kubelet writes, written
// out by hand from its fieldpath and resource helpers.
func TestValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		item  v1.DownwardAPIVolumeFile
		alloc v1.ResourceList
		want  string
	}{
		{"name", field("f", "metadata.name"), node, "web-0"},
		{"namespace", field("f", "metadata.namespace"), node, "shop"},
		{"uid", field("f", "metadata.uid"), node, "0a1b2c3d-0000-4000-8000-000000000001"},
		{"labels: sorted, Go-quoted, no final newline", field("f", "metadata.labels"), node,
			"app=\"say \\\"hi\\\"\"\ntier=\"front\"\nz=\"é\\ttab\""},
		{"annotations", field("f", "metadata.annotations"), node,
			"Example.com/Owner=\"team-a\"\nnote=\"line1\\nline2\""},
		{"one label", field("f", "metadata.labels['tier']"), node, "front"},
		{"a missing label is empty", field("f", "metadata.labels['gone']"), node, ""},
		{"one annotation, key with capitals", field("f", "metadata.annotations['Example.com/Owner']"), node, "team-a"},
		{"limits.cpu rounded up to cores", res("f", "app", "limits.cpu", ""), node, "1"},
		{"limits.cpu in millicores", res("f", "app", "limits.cpu", "1m"), node, "250"},
		{"requests.cpu in 10m", res("f", "app", "requests.cpu", "10m"), node, "10"},
		{"limits.memory in bytes", res("f", "app", "limits.memory", ""), node, "67108864"},
		{"limits.memory in Mi", res("f", "app", "limits.memory", "1Mi"), node, "64"},
		{"limits.memory in M, rounded up", res("f", "app", "limits.memory", "1M"), node, "68"},
		{"requests.memory in Ki", res("f", "app", "requests.memory", "1Ki"), node, "32768"},
		{"a zero limit is the node's", res("f", "app", "limits.ephemeral-storage", "1Gi"), node, "10"},
		{"requests.ephemeral-storage rounded up", res("f", "app", "requests.ephemeral-storage", "1Gi"), node, "2"},
		{"limits.hugepages", res("f", "app", "limits.hugepages-2Mi", "2Mi"), node, "2"},
		{"requests.hugepages", res("f", "app", "requests.hugepages-2Mi", ""), node, "4194304"},
		{"an undeclared hugepages size is 0", res("f", "app", "limits.hugepages-1Gi", ""), node, "0"},
		{"no cpu limit: the node's", res("f", "bare", "limits.cpu", "1m"), node, "4000"},
		{"no memory limit: the node's", res("f", "bare", "limits.memory", "1Gi"), node, "8"},
		{"no limit, node unknown: 0", res("f", "bare", "limits.memory", ""), nil, "0"},
		{"no request: 0, never the node's", res("f", "bare", "requests.cpu", ""), node, "0"},
		{"a divisor of zero is 1", res("f", "app", "requests.cpu", "0"), node, "1"},
		{"an init container (sidecar)", res("f", "sidecar", "limits.cpu", ""), node, "2"},
		{"no ref: an empty file", v1.DownwardAPIVolumeFile{Path: "f"}, node, ""},
		{"fieldRef wins over resourceFieldRef", v1.DownwardAPIVolumeFile{Path: "f",
			FieldRef:         &v1.ObjectFieldSelector{FieldPath: "metadata.name"},
			ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "nope", Resource: "limits.cpu"}}, nil, "web-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Payload(testPod(), Source{Items: []v1.DownwardAPIVolumeFile{tc.item}, DefaultMode: ptr[int32](0o644)}, tc.alloc)
			if err != nil {
				t.Fatal(err)
			}
			if f, ok := got["f"]; !ok || len(got) != 1 || string(f.Data) != tc.want {
				t.Fatalf("got %q (%d files), want %q", got["f"].Data, len(got), tc.want)
			}
		})
	}
}

const labelKeyMsg = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character " +
	"(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"

// TestPodLevelLimitsNotRead: a pod with pod-level limits still shows the
// node's allocatable amount for a container limit it does not declare, as
// the kubelet's downwardAPI volume plugin (v1.37) shows it; the pod-level
// fallback of 1.34 is for environment variables only. Declared container
// limits and requests are unchanged by pod-level resources.
func TestPodLevelLimitsNotRead(t *testing.T) {
	pod := testPod()
	pod.Spec.Resources = &v1.ResourceRequirements{
		Limits:   rl("cpu", "1250m", "memory", "1Gi", "ephemeral-storage", "3Gi", "hugepages-2Mi", "8Mi"),
		Requests: rl("cpu", "1", "memory", "512Mi"),
	}
	for _, tc := range []struct {
		name string
		item v1.DownwardAPIVolumeFile
		want string
	}{
		{"limits.cpu", res("f", "bare", "limits.cpu", "1m"), "4000"},
		{"limits.memory", res("f", "bare", "limits.memory", "1Gi"), "8"},
		{"limits.ephemeral-storage", res("f", "bare", "limits.ephemeral-storage", "1Gi"), "10"},
		{"a zero container limit", res("f", "app", "limits.ephemeral-storage", "1Gi"), "10"},
		{"limits.hugepages", res("f", "bare", "limits.hugepages-2Mi", ""), "0"},
		{"requests.cpu", res("f", "bare", "requests.cpu", "1m"), "0"},
		{"requests.memory", res("f", "bare", "requests.memory", ""), "0"},
		{"a declared limit", res("f", "app", "limits.cpu", "1m"), "250"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Payload(pod, Source{Items: []v1.DownwardAPIVolumeFile{tc.item}, DefaultMode: ptr[int32](0o644)}, node)
			if err != nil {
				t.Fatal(err)
			}
			if f := got["f"]; string(f.Data) != tc.want {
				t.Fatalf("got %q, want %q", f.Data, tc.want)
			}
		})
	}
}

// TestErrors: the kubelet's texts, every item's error, distinct errors
// aggregated as "[a, b]".
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items []v1.DownwardAPIVolumeFile
		mode  *int32
		want  string
	}{
		{"no default mode", []v1.DownwardAPIVolumeFile{field("f", "metadata.name")}, nil,
			"no defaultMode used, not even the default value for it"},
		{"unsupported field", []v1.DownwardAPIVolumeFile{field("f", "spec.nodeName")}, ptr[int32](0o644),
			"unsupported fieldPath: spec.nodeName"},
		{"subscript of a field without keys", []v1.DownwardAPIVolumeFile{field("f", "metadata.name['x']")}, ptr[int32](0o644),
			`fieldPath "metadata.name['x']" does not support subscript`},
		{"invalid label key", []v1.DownwardAPIVolumeFile{field("f", "metadata.labels['Bad Key']")}, ptr[int32](0o644),
			"invalid key subscript in metadata.labels['Bad Key']: " + labelKeyMsg},
		{"label prefix checked as it is", []v1.DownwardAPIVolumeFile{field("f", "metadata.labels['Example.com/app']")}, ptr[int32](0o644),
			"invalid key subscript in metadata.labels['Example.com/app']: prefix part a lowercase RFC 1123 subdomain must consist of lower case " +
				"alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', " +
				`regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`},
		{"empty label key", []v1.DownwardAPIVolumeFile{field("f", "metadata.labels['']")}, ptr[int32](0o644),
			"invalid key subscript in metadata.labels['']: name part must be non-empty;" + labelKeyMsg},
		{"unknown container", []v1.DownwardAPIVolumeFile{res("f", "nope", "limits.cpu", "")}, ptr[int32](0o644),
			"container nope not found"},
		{"unsupported resource", []v1.DownwardAPIVolumeFile{res("f", "app", "limits.nvidia.com/gpu", "")}, ptr[int32](0o644),
			"unsupported container resource : limits.nvidia.com/gpu"},
		{"every error, distinct ones once", []v1.DownwardAPIVolumeFile{
			field("a", "spec.nodeName"), field("b", "metadata.name"), res("c", "nope", "limits.cpu", ""), field("d", "spec.nodeName"),
		}, ptr[int32](0o644), "[unsupported fieldPath: spec.nodeName, container nope not found]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Payload(testPod(), Source{Items: tc.items, DefaultMode: tc.mode}, node)
			if err == nil || err.Error() != tc.want || got != nil {
				t.Fatalf("got %v, %v;\nwant error %s", got, err, tc.want)
			}
		})
	}
}

// TestFiles: paths cleaned, modes and owners as the kubelet gives them, the
// last of two items with one path winning.
func TestFiles(t *testing.T) {
	items := []v1.DownwardAPIVolumeFile{
		field("labels", "metadata.labels"),
		field("meta//./name", "metadata.name"),
		res("limits/cpu", "app", "limits.cpu", "1m"),
		field("uid", "metadata.uid"),
		field("dup", "metadata.namespace"),
		field("dup/", "metadata.name"),
	}
	items[1].Mode = ptr[int32](0o400)
	items[2].User = ptr[int64](1000)
	items[3].User, items[3].Mode = ptr[int64](2000), ptr[int32](0o440)
	for _, tc := range []struct {
		name       string
		userFields bool
		want       map[string]atomicwriter.File
	}{
		{"user fields off: no owners", false, map[string]atomicwriter.File{
			"labels":     {Data: []byte("app=\"say \\\"hi\\\"\"\ntier=\"front\"\nz=\"é\\ttab\""), Mode: 0o600},
			"meta/name":  {Data: []byte("web-0"), Mode: 0o400},
			"limits/cpu": {Data: []byte("250"), Mode: 0o600},
			"uid":        {Data: []byte("0a1b2c3d-0000-4000-8000-000000000001"), Mode: 0o440},
			"dup":        {Data: []byte("web-0"), Mode: 0o600},
		}},
		{"user fields on: the item's user, else the default", true, map[string]atomicwriter.File{
			"labels":     {Data: []byte("app=\"say \\\"hi\\\"\"\ntier=\"front\"\nz=\"é\\ttab\""), Mode: 0o600, FSUser: ptr[int64](3000)},
			"meta/name":  {Data: []byte("web-0"), Mode: 0o400, FSUser: ptr[int64](3000)},
			"limits/cpu": {Data: []byte("250"), Mode: 0o600, FSUser: ptr[int64](1000)},
			"uid":        {Data: []byte("0a1b2c3d-0000-4000-8000-000000000001"), Mode: 0o440, FSUser: ptr[int64](2000)},
			"dup":        {Data: []byte("web-0"), Mode: 0o600, FSUser: ptr[int64](3000)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Payload(testPod(), Source{Items: items, DefaultMode: ptr[int32](0o600), DefaultUser: ptr[int64](3000), UserFields: tc.userFields}, node)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(tc.want))) {
				t.Fatalf("paths %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(tc.want)))
			}
			for p, w := range tc.want {
				g := got[p]
				if string(g.Data) != string(w.Data) || g.Mode != w.Mode || (g.FSUser == nil) != (w.FSUser == nil) || g.FSUser != nil && *g.FSUser != *w.FSUser {
					t.Errorf("%s: got %q mode %o user %v, want %q mode %o user %v", p, g.Data, g.Mode, g.FSUser, w.Data, w.Mode, w.FSUser)
				}
			}
		})
	}
}

// TestEmpty: no items, no labels: an empty payload, and an empty labels
// file.
func TestEmpty(t *testing.T) {
	p := testPod()
	p.Labels = nil
	got, err := Payload(p, Source{DefaultMode: ptr[int32](0o644)}, nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("no items: %v, %v", got, err)
	}
	got, err = Payload(p, Source{Items: []v1.DownwardAPIVolumeFile{field("l", "metadata.labels")}, DefaultMode: ptr[int32](0o644)}, nil)
	if err != nil || len(got) != 1 || got["l"].Data == nil || len(got["l"].Data) != 0 {
		t.Fatalf("no labels: %v, %v", got, err)
	}
	if _, err := Payload(nil, Source{DefaultMode: ptr[int32](0o644)}, nil); err == nil {
		t.Fatal("nil pod: no error")
	}
}

func TestNeedsNodeAllocatable(t *testing.T) {
	both := v1.DownwardAPIVolumeFile{Path: "x", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}, ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.cpu"}}
	for _, tc := range []struct {
		items []v1.DownwardAPIVolumeFile
		want  bool
	}{
		{nil, false},
		{[]v1.DownwardAPIVolumeFile{field("a", "metadata.name"), both}, false},
		{[]v1.DownwardAPIVolumeFile{field("a", "metadata.name"), res("b", "app", "requests.cpu", "")}, true},
	} {
		if got := NeedsNodeAllocatable(tc.items); got != tc.want {
			t.Errorf("NeedsNodeAllocatable(%v) = %v", tc.items, got)
		}
	}
}
