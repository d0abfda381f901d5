package volumemanager

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/internal/operationexecutor"
)

func TestSELinuxFileLabel(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts *v1.SELinuxOptions
		want string
		err  bool
	}{
		{name: "none", opts: nil, want: ""},
		{name: "empty", opts: &v1.SELinuxOptions{}, want: ""},
		{name: "level only: host defaults for the rest", opts: &v1.SELinuxOptions{Level: "s0:c1,c2"}, want: "system_u:object_r:container_file_t:s0:c1,c2"},
		{name: "user and level reach the file label", opts: &v1.SELinuxOptions{User: "staff_u", Level: "s0:c1,c2"}, want: "staff_u:object_r:container_file_t:s0:c1,c2"},
		{name: "role and type label the process, not its files",
			opts: &v1.SELinuxOptions{Role: "system_r", Type: "spc_t", Level: "s0:c5,c6"}, want: "system_u:object_r:container_file_t:s0:c5,c6"},
		{name: "MLS range", opts: &v1.SELinuxOptions{Level: "s0-s0:c0.c1023"}, want: "system_u:object_r:container_file_t:s0-s0:c0.c1023"},
		{name: "no level: the kubelet's would be random", opts: &v1.SELinuxOptions{Type: "container_t"}, want: seLinuxNoLevel},
		{name: "quote in the level", opts: &v1.SELinuxOptions{Level: `s0",rw`}, err: true},
		{name: "space in the level", opts: &v1.SELinuxOptions{Level: "s0 c1"}, err: true},
		{name: "colon in the user", opts: &v1.SELinuxOptions{User: "a:b", Level: "s0"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seLinuxFileLabel(tc.opts)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error %v", err, tc.err)
			}
			if got != tc.want {
				t.Errorf("label %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSELinuxMountContext(t *testing.T) {
	const label12 = "system_u:object_r:container_file_t:s0:c1,c2"
	c12 := &v1.SELinuxOptions{Level: "s0:c1,c2"}
	c34 := &v1.SELinuxOptions{Level: "s0:c3,c4"}
	rwop := []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}
	on := func(mod func(*seLinuxMountInput)) seLinuxMountInput {
		in := seLinuxMountInput{HostEnabled: true, DriverSupport: true, AccessModes: rwop, Containers: []*v1.SELinuxOptions{c12}}
		if mod != nil {
			mod(&in)
		}
		return in
	}
	for _, tc := range []struct {
		name string
		in   seLinuxMountInput
		want string
		err  string
	}{
		{name: "everything applies", in: on(nil), want: label12},
		{name: "two containers, one label", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c12, nil, c12} }), want: label12},
		{name: "host without SELinux", in: on(func(in *seLinuxMountInput) { in.HostEnabled = false })},
		{name: "driver without seLinuxMount", in: on(func(in *seLinuxMountInput) { in.DriverSupport = false })},
		{name: "ReadWriteOnce (SELinuxMount gate off in 1.33)", in: on(func(in *seLinuxMountInput) {
			in.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
		})},
		{name: "ReadWriteOncePod among others", in: on(func(in *seLinuxMountInput) {
			in.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod, v1.ReadOnlyMany}
		})},
		{name: "inline volume", in: on(func(in *seLinuxMountInput) { in.AccessModes = nil })},
		{name: "seLinuxChangePolicy Recursive", in: on(func(in *seLinuxMountInput) { in.Recursive = true })},
		{name: "no container has a label", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{nil} })},
		{name: "no level", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{{Type: "spc_t"}} })},
		{name: "containers disagree", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c34, c12} }),
			err: "the containers that mount it have different SELinux labels: system_u:object_r:container_file_t:s0:c1,c2, system_u:object_r:container_file_t:s0:c3,c4"},
		{name: "a level and none", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c12, {Type: "spc_t"}} }),
			err: "the containers that mount it have different SELinux labels: <random level>, system_u:object_r:container_file_t:s0:c1,c2"},
		{name: "containers disagree, driver without support: still an error, as the kubelet's",
			in:  on(func(in *seLinuxMountInput) { in.DriverSupport = false; in.Containers = []*v1.SELinuxOptions{c34, c12} }),
			err: "the containers that mount it have different SELinux labels: system_u:object_r:container_file_t:s0:c1,c2, system_u:object_r:container_file_t:s0:c3,c4"},
		{name: "containers disagree on a ReadWriteOnce volume: a warning only", in: on(func(in *seLinuxMountInput) {
			in.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
			in.Containers = []*v1.SELinuxOptions{c34, c12}
		})},
		{name: "invalid level", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{{Level: `s0"`}} }),
			err: `invalid seLinuxOptions.level "s0\""`},
		{name: "invalid level on a ReadWriteOnce volume", in: on(func(in *seLinuxMountInput) {
			in.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
			in.Containers = []*v1.SELinuxOptions{{Level: `s0"`}}
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seLinuxMountContext(tc.in)
			var gotErr string
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tc.err {
				t.Fatalf("error %q, want %q", gotErr, tc.err)
			}
			if got != tc.want {
				t.Errorf("context %q, want %q", got, tc.want)
			}
		})
	}
}

func TestContainerSELinuxOptions(t *testing.T) {
	podOpts := &v1.SELinuxOptions{Level: "s0:c1,c2"}
	own := &v1.SELinuxOptions{Level: "s0:c7,c8"}
	mount := func(name string) []v1.VolumeMount { return []v1.VolumeMount{{Name: name, MountPath: "/" + name}} }
	pod := &v1.Pod{Spec: v1.PodSpec{
		SecurityContext: &v1.PodSecurityContext{SELinuxOptions: podOpts},
		InitContainers:  []v1.Container{{Name: "init", VolumeMounts: mount("data")}},
		Containers: []v1.Container{
			{Name: "own", VolumeMounts: mount("data"), SecurityContext: &v1.SecurityContext{SELinuxOptions: own}},
			{Name: "other-volume", VolumeMounts: mount("logs"), SecurityContext: &v1.SecurityContext{SELinuxOptions: own}},
			{Name: "no-selinux", VolumeMounts: mount("data"), SecurityContext: &v1.SecurityContext{}},
		},
		EphemeralContainers: []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
			Name: "debug", VolumeMounts: mount("data"), SecurityContext: &v1.SecurityContext{SELinuxOptions: own}}}},
	}}
	got := containerSELinuxOptions(pod, "data")
	want := []*v1.SELinuxOptions{podOpts, own, podOpts, own}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("data: %v, want %v", got, want)
	}
	pod.Spec.SecurityContext = nil
	got = containerSELinuxOptions(pod, "data")
	if want := []*v1.SELinuxOptions{own, own}; !reflect.DeepEqual(got, want) {
		t.Errorf("data without pod options: %v, want %v", got, want)
	}
}

func TestAdmitSELinux(t *testing.T) {
	const name = cache.UniqueVolumeName("kubernetes.io/csi/drv^h")
	pv := func(pod, label string) cache.PodVolume {
		return cache.PodVolume{Pod: cache.PodRef{UID: types.UID("uid-" + pod), Namespace: "ns", Name: pod}, SpecName: "data", SELinuxLabel: label}
	}
	mounted := func(p cache.PodVolume, st cache.MountState) cache.PodMount {
		return cache.PodMount{Volume: p, State: st}
	}
	for _, tc := range []struct {
		name string
		v    volumeView
		want string
		// refused: pod -> the pod it is told it conflicts with
		refused map[string]string
	}{
		{name: "nothing done: the first pod in UID order sets the context",
			v:    volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y"), pv("c", "X")}},
			want: "X", refused: map[string]string{"b": "a"}},
		{name: "a mounted pod keeps its context",
			v: volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: cache.ActualVolume{DeviceState: cache.Mounted, SELinuxContext: "Y", Pods: map[types.UID]cache.PodMount{"uid-b": mounted(pv("b", "Y"), cache.Mounted)}}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a publish in flight counts as mounted",
			v: volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: cache.ActualVolume{DeviceState: cache.Mounted, SELinuxContext: "Y", Pods: map[types.UID]cache.PodMount{"uid-b": {Volume: pv("b", "Y"), Busy: true}}}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "the staged device's context wins over UID order",
			v: volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: cache.ActualVolume{DeviceState: cache.Uncertain, SELinuxContext: "Y"}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a stage in flight fixes the context",
			v: volumeView{Name: name, Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual:   cache.ActualVolume{SELinuxContext: "Y"},
				InFlight: map[oe.Key]oe.OpKind{{Volume: name}: oe.OpStage}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a device unstaged: its old context does not count",
			v: volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: cache.ActualVolume{DeviceState: cache.NotMounted, SELinuxContext: "Y"}},
			want: "X", refused: map[string]string{"b": "a"}},
		{name: "a device staged with a context no pod wants: the new one, no refusal (restaged)",
			v: volumeView{Desired: []cache.PodVolume{pv("b", "Y")}, Known: true,
				Actual: cache.ActualVolume{DeviceState: cache.Mounted, SELinuxContext: "X"}},
			want: "Y"},
		{name: "no context and a context conflict",
			v:    volumeView{Desired: []cache.PodVolume{pv("a", ""), pv("b", "Y")}},
			want: "", refused: map[string]string{"b": "a"}},
		{name: "all agree", v: volumeView{Desired: []cache.PodVolume{pv("a", "X"), pv("b", "X")}}, want: "X"},
		{name: "nobody wants it", v: volumeView{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.v.Name == "" {
				tc.v.Name = name
			}
			tc.v.Spec.Driver = "drv"
			got := admitSELinux(tc.v)
			if got.Context != tc.want {
				t.Errorf("context %q, want %q", got.Context, tc.want)
			}
			refused := map[string]string{}
			for uid, e := range got.Refused {
				if e.Pod.UID != uid || e.Volume != name || e.Driver != "drv" {
					t.Errorf("conflict of %s: %+v", uid, e)
				}
				refused[e.Pod.Name] = e.Other.Name
				if e.OtherContext != got.Context {
					t.Errorf("conflict of %s names context %q, want %q", uid, e.OtherContext, got.Context)
				}
			}
			if len(tc.refused) == 0 {
				tc.refused = map[string]string{}
			}
			if !reflect.DeepEqual(refused, tc.refused) {
				t.Errorf("refused %v, want %v", refused, tc.refused)
			}
		})
	}
}

func TestSELinuxConflictErrorText(t *testing.T) {
	e := &SELinuxConflictError{Volume: "kubernetes.io/csi/drv^h", Driver: "drv",
		Pod: cache.PodRef{Namespace: "ns", Name: "b"}, Context: "system_u:object_r:container_file_t:s0:c3,c4",
		Other: cache.PodRef{Namespace: "ns", Name: "a"}}
	want := `conflicting SELinux labels of volume kubernetes.io/csi/drv^h (driver drv): pod ns/b would mount it with SELinux context "system_u:object_r:container_file_t:s0:c3,c4", ` +
		`but pod ns/a uses it with no SELinux context; a volume is mounted with one context at a time, so pod ns/b waits until the volume is no longer used by pod ns/a`
	if e.Error() != want {
		t.Errorf("got\n%s\nwant\n%s", e.Error(), want)
	}
}
