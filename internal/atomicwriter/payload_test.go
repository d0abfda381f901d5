package atomicwriter

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func ptr[T any](v T) *T { return &v }

func TestConfigMapPayload(t *testing.T) {
	cm := &v1.ConfigMap{
		Data:       map[string]string{"a": "A", "b": "B"},
		BinaryData: map[string][]byte{"bin": {0, 1}},
	}
	for _, tc := range []struct {
		name string
		cm   *v1.ConfigMap
		it   Items
		want map[string]File
		err  string
	}{
		{
			name: "every key, default mode",
			cm:   cm,
			it:   Items{DefaultMode: ptr(int32(0o644))},
			want: map[string]File{"a": {Data: []byte("A"), Mode: 0o644}, "b": {Data: []byte("B"), Mode: 0o644}, "bin": {Data: []byte{0, 1}, Mode: 0o644}},
		},
		{
			name: "items with paths and modes",
			cm:   cm,
			it: Items{DefaultMode: ptr(int32(0o644)), Items: []v1.KeyToPath{
				{Key: "a", Path: "x/a.txt", Mode: ptr(int32(0o400))},
				{Key: "bin", Path: "bin"},
			}},
			want: map[string]File{"x/a.txt": {Data: []byte("A"), Mode: 0o400}, "bin": {Data: []byte{0, 1}, Mode: 0o644}},
		},
		{
			name: "missing key",
			cm:   cm,
			it:   Items{DefaultMode: ptr(int32(0o644)), Items: []v1.KeyToPath{{Key: "nope", Path: "n"}}},
			err:  "configmap references non-existent config key: nope",
		},
		{
			name: "missing key, optional",
			cm:   cm,
			it:   Items{DefaultMode: ptr(int32(0o644)), Optional: true, Items: []v1.KeyToPath{{Key: "nope", Path: "n"}, {Key: "b", Path: "b"}}},
			want: map[string]File{"b": {Data: []byte("B"), Mode: 0o644}},
		},
		{
			name: "missing optional configMap",
			it:   Items{DefaultMode: ptr(int32(0o644)), Optional: true},
			want: map[string]File{},
		},
		{
			name: "no default mode",
			cm:   cm,
			err:  "no defaultMode used, not even the default value for it",
		},
		{
			name: "users ignored without the feature",
			cm:   &v1.ConfigMap{Data: map[string]string{"a": "A"}},
			it:   Items{DefaultMode: ptr(int32(0o644)), DefaultUser: ptr(int64(7)), Items: []v1.KeyToPath{{Key: "a", Path: "a", User: ptr(int64(8))}}},
			want: map[string]File{"a": {Data: []byte("A"), Mode: 0o644}},
		},
		{
			name: "item user over default user",
			cm:   &v1.ConfigMap{Data: map[string]string{"a": "A", "b": "B"}},
			it: Items{DefaultMode: ptr(int32(0o644)), DefaultUser: ptr(int64(7)), UserFields: true,
				Items: []v1.KeyToPath{{Key: "a", Path: "a", User: ptr(int64(8))}, {Key: "b", Path: "b"}}},
			want: map[string]File{"a": {Data: []byte("A"), Mode: 0o644, FSUser: ptr(int64(8))}, "b": {Data: []byte("B"), Mode: 0o644, FSUser: ptr(int64(7))}},
		},
		{
			name: "default user on every key",
			cm:   &v1.ConfigMap{Data: map[string]string{"a": "A"}},
			it:   Items{DefaultMode: ptr(int32(0o600)), DefaultUser: ptr(int64(7)), UserFields: true},
			want: map[string]File{"a": {Data: []byte("A"), Mode: 0o600, FSUser: ptr(int64(7))}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigMapPayload(tc.cm, tc.it)
			checkPayload(t, got, err, tc.want, tc.err)
		})
	}
}

func TestSecretPayload(t *testing.T) {
	s := &v1.Secret{Data: map[string][]byte{"user": []byte("u"), "pass": []byte("p")}}
	for _, tc := range []struct {
		name string
		s    *v1.Secret
		it   Items
		want map[string]File
		err  string
	}{
		{
			name: "every key",
			s:    s,
			it:   Items{DefaultMode: ptr(int32(0o400))},
			want: map[string]File{"user": {Data: []byte("u"), Mode: 0o400}, "pass": {Data: []byte("p"), Mode: 0o400}},
		},
		{
			name: "items",
			s:    s,
			it:   Items{DefaultMode: ptr(int32(0o644)), Items: []v1.KeyToPath{{Key: "pass", Path: "p/w", Mode: ptr(int32(0o600))}}},
			want: map[string]File{"p/w": {Data: []byte("p"), Mode: 0o600}},
		},
		{
			name: "missing key",
			s:    s,
			it:   Items{DefaultMode: ptr(int32(0o644)), Items: []v1.KeyToPath{{Key: "token", Path: "t"}}},
			err:  "references non-existent secret key: token",
		},
		{
			name: "missing optional secret with items",
			it:   Items{DefaultMode: ptr(int32(0o644)), Optional: true, Items: []v1.KeyToPath{{Key: "token", Path: "t"}}},
			want: map[string]File{},
		},
		{
			name: "no default mode",
			s:    s,
			err:  "no defaultMode used, not even the default value for it",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SecretPayload(tc.s, tc.it)
			checkPayload(t, got, err, tc.want, tc.err)
		})
	}
}

func checkPayload(t *testing.T, got map[string]File, err error, want map[string]File, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || err.Error() != wantErr {
			t.Fatalf("err = %v, want %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("payload = %v, want %v", got, want)
	}
}

func TestFileUserAndProjectedMode(t *testing.T) {
	pod, def, item := ptr(int64(1)), ptr(int64(2)), ptr(int64(3))
	for _, tc := range []struct {
		name           string
		fields         bool
		pod, def, item *int64
		want           *int64
		fsGroup        *int64
		wantMode       int32
	}{
		{name: "nothing", wantMode: 0o644},
		{name: "pod user only", pod: pod, def: def, item: item, want: pod, wantMode: 0o600},
		{name: "fields: item", fields: true, pod: pod, def: def, item: item, want: item, wantMode: 0o600},
		{name: "fields: default", fields: true, pod: pod, def: def, want: def, wantMode: 0o600},
		{name: "fields: pod", fields: true, pod: pod, want: pod, wantMode: 0o600},
		{name: "fsGroup", fsGroup: ptr(int64(9)), wantMode: 0o600},
	} {
		got := FileUser(tc.fields, tc.pod, tc.def, tc.item)
		if got != tc.want {
			t.Errorf("%s: FileUser = %v, want %v", tc.name, got, tc.want)
		}
		if m := ProjectedMode(0o644, got, tc.fsGroup); m != tc.wantMode {
			t.Errorf("%s: ProjectedMode = %o, want %o", tc.name, m, tc.wantMode)
		}
	}
}

// TestFSUser: the kubelet's FsUserFrom: the one runAsUser of every
// container, its own or the pod's.
func TestFSUser(t *testing.T) {
	u := func(v int64) *v1.SecurityContext { return &v1.SecurityContext{RunAsUser: &v} }
	for _, tc := range []struct {
		name       string
		podUser    *int64
		containers []*v1.SecurityContext
		initC      *v1.SecurityContext
		want       *int64
	}{
		{name: "none", containers: []*v1.SecurityContext{nil}},
		{name: "the pod's", podUser: ptr[int64](1000), containers: []*v1.SecurityContext{nil, nil}, want: ptr[int64](1000)},
		{name: "the containers' own, the same", containers: []*v1.SecurityContext{u(7), u(7)}, want: ptr[int64](7)},
		{name: "two differ", containers: []*v1.SecurityContext{u(7), u(8)}},
		{name: "one has none", containers: []*v1.SecurityContext{u(7), nil}},
		{name: "a container's overrides the pod's", podUser: ptr[int64](1000), containers: []*v1.SecurityContext{u(7), nil}},
		{name: "an init container counts", podUser: ptr[int64](7), containers: []*v1.SecurityContext{nil}, initC: u(0)},
		{name: "no containers"},
	} {
		pod := &v1.Pod{}
		if tc.podUser != nil {
			pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: tc.podUser}
		}
		for _, sc := range tc.containers {
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{SecurityContext: sc})
		}
		if tc.initC != nil {
			pod.Spec.InitContainers = []v1.Container{{SecurityContext: tc.initC}}
		}
		if got := FSUser(pod); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: FSUser = %v, want %v", tc.name, got, tc.want)
		}
	}
}
