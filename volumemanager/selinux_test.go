package volumemanager

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
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
