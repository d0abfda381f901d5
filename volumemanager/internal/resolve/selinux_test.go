package resolve

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
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

// TestSELinuxMountContext: the 1.37 decision (SELinuxMount on): a PV of
// any access mode is mounted with its containers' label when the plugin
// supports it and the pod is not Recursive; an inline volume never is, and
// its containers' problems are warnings, not errors.
func TestSELinuxMountContext(t *testing.T) {
	const label12 = "system_u:object_r:container_file_t:s0:c1,c2"
	const both = "the containers that mount it have different SELinux labels: system_u:object_r:container_file_t:s0:c1,c2, system_u:object_r:container_file_t:s0:c3,c4"
	c12 := &v1.SELinuxOptions{Level: "s0:c1,c2"}
	c34 := &v1.SELinuxOptions{Level: "s0:c3,c4"}
	on := func(mod func(*seLinuxMountInput)) seLinuxMountInput {
		in := seLinuxMountInput{HostEnabled: true, PluginSupport: true, PV: true, Containers: []*v1.SELinuxOptions{c12}}
		if mod != nil {
			mod(&in)
		}
		return in
	}
	inline := func(in *seLinuxMountInput) { in.PV = false }
	for _, tc := range []struct {
		name string
		in   seLinuxMountInput
		want seLinuxMount
		err  string
	}{
		{name: "a PV, whatever its access modes", in: on(nil), want: seLinuxMount{Context: label12, Label: label12}},
		{name: "two containers, one label", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c12, nil, c12} }),
			want: seLinuxMount{Context: label12, Label: label12}},
		{name: "host without SELinux", in: on(func(in *seLinuxMountInput) { in.HostEnabled = false })},
		{name: "host without SELinux, containers disagree", in: on(func(in *seLinuxMountInput) {
			in.HostEnabled = false
			in.Containers = []*v1.SELinuxOptions{c34, c12}
		})},
		{name: "plugin without context mounts", in: on(func(in *seLinuxMountInput) { in.PluginSupport = false })},
		{name: "inline volume: admitted, never mounted with a context", in: on(inline), want: seLinuxMount{Label: label12}},
		{name: "seLinuxChangePolicy Recursive", in: on(func(in *seLinuxMountInput) { in.Recursive = true })},
		{name: "no container has a label", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{nil} })},
		{name: "no level", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{{Type: "spc_t"}} })},
		{name: "containers disagree", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c34, c12} }),
			want: seLinuxMount{Problem: SELinuxContainersDisagree}, err: both},
		{name: "a level and none", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{c12, {Type: "spc_t"}} }),
			want: seLinuxMount{Problem: SELinuxContainersDisagree},
			err:  "the containers that mount it have different SELinux labels: <random level>, system_u:object_r:container_file_t:s0:c1,c2"},
		{name: "containers disagree, plugin without support: still an error",
			in:   on(func(in *seLinuxMountInput) { in.PluginSupport = false; in.Containers = []*v1.SELinuxOptions{c34, c12} }),
			want: seLinuxMount{Problem: SELinuxContainersDisagree}, err: both},
		{name: "containers disagree, Recursive: still an error",
			in:   on(func(in *seLinuxMountInput) { in.Recursive = true; in.Containers = []*v1.SELinuxOptions{c34, c12} }),
			want: seLinuxMount{Problem: SELinuxContainersDisagree}, err: both},
		{name: "containers disagree on an inline volume: a warning only", in: on(func(in *seLinuxMountInput) {
			inline(in)
			in.Containers = []*v1.SELinuxOptions{c34, c12}
		}), want: seLinuxMount{Problem: SELinuxContainersDisagree}},
		{name: "invalid level", in: on(func(in *seLinuxMountInput) { in.Containers = []*v1.SELinuxOptions{{Level: `s0"`}} }),
			want: seLinuxMount{Problem: SELinuxBadOptions}, err: `invalid seLinuxOptions.level "s0\""`},
		{name: "invalid level on an inline volume: a warning only", in: on(func(in *seLinuxMountInput) {
			inline(in)
			in.Containers = []*v1.SELinuxOptions{{Level: `s0"`}}
		}), want: seLinuxMount{Problem: SELinuxBadOptions}},
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
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestSELinuxMetricLabels: the kubelet's volume_plugin and access_mode
// labels: the CSI plugin with its driver after a slash, and the widest
// access mode of the PV.
func TestSELinuxMetricLabels(t *testing.T) {
	pv := func(modes ...v1.PersistentVolumeAccessMode) podvol.VolumeSpec {
		return podvol.VolumeSpec{PVName: "pv", Driver: "drv", AccessModes: modes}
	}
	for _, tc := range []struct {
		name         string
		spec         podvol.VolumeSpec
		plugin, mode string
	}{
		{name: "inline CSI", spec: podvol.VolumeSpec{Driver: "drv", AccessMode: "ReadWriteOnce"}, plugin: "kubernetes.io/csi/drv", mode: "inline"},
		{name: "RWOP", spec: pv(v1.ReadWriteOncePod), plugin: "kubernetes.io/csi/drv", mode: "RWOP"},
		{name: "RWO and RWOP", spec: pv(v1.ReadWriteOncePod, v1.ReadWriteOnce), plugin: "kubernetes.io/csi/drv", mode: "RWO"},
		{name: "ROX over RWO", spec: pv(v1.ReadWriteOnce, v1.ReadOnlyMany), plugin: "kubernetes.io/csi/drv", mode: "ROX"},
		{name: "RWX first", spec: pv(v1.ReadOnlyMany, v1.ReadWriteMany), plugin: "kubernetes.io/csi/drv", mode: "RWX"},
		{name: "no access mode", spec: pv(), plugin: "kubernetes.io/csi/drv", mode: ""},
		{name: "local PV", spec: podvol.VolumeSpec{PVName: "pv", Plugin: "kubernetes.io/local-volume", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
			plugin: "kubernetes.io/local-volume", mode: "RWO"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SELinuxPluginLabel(&tc.spec); got != tc.plugin {
				t.Errorf("volume_plugin %q, want %q", got, tc.plugin)
			}
			if got := AccessModeLabel(&tc.spec); got != tc.mode {
				t.Errorf("access_mode %q, want %q", got, tc.mode)
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
