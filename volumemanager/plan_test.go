package volumemanager

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
)

func TestPlan(t *testing.T) {
	const vol = cache.UniqueVolumeName("v")
	pv := func(uid string) cache.PodVolume {
		return cache.PodVolume{Pod: cache.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data"}
	}
	mounts := func(states ...string) map[types.UID]cache.PodMount {
		out := map[types.UID]cache.PodMount{}
		for _, s := range states { // "uid=State"
			uid, st, _ := strings.Cut(s, "=")
			m := cache.PodMount{Volume: pv(uid)}
			fmt.Sscan(map[string]string{"Mounted": "2", "Uncertain": "1", "NotMounted": "0"}[st], (*int)(&m.State))
			out[types.UID(uid)] = m
		}
		return out
	}
	staged := cache.ActualVolume{Attached: true, DeviceState: cache.Mounted}
	tests := []struct {
		name     string
		desired  []cache.PodVolume
		spec     cache.VolumeSpec
		actual   cache.ActualVolume
		known    bool
		want     string
		wantDone bool
	}{
		{name: "new volume: confirm attach", desired: []cache.PodVolume{pv("a")}, want: "verify_controller_attached_volume v"},
		{name: "attached: stage", desired: []cache.PodVolume{pv("a")}, known: true, actual: cache.ActualVolume{Attached: true}, want: "mount_device v"},
		{name: "uncertain device: stage again", desired: []cache.PodVolume{pv("a")}, known: true, actual: cache.ActualVolume{Attached: true, DeviceState: cache.Uncertain}, want: "mount_device v"},
		{name: "staged: publish every pod lacking it", desired: []cache.PodVolume{pv("a"), pv("b"), pv("c")}, known: true,
			actual: cache.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("b=Mounted", "c=Uncertain")},
			want:   "volume_mount v pod=ns/a; volume_mount v pod=ns/c"},
		{name: "all published: nothing", desired: []cache.PodVolume{pv("a")}, known: true, actual: cache.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")}},
		{name: "pod moved: unpublish before publish", desired: []cache.PodVolume{pv("b")}, known: true,
			actual: cache.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")},
			want:   "volume_unmount v pod=ns/a; volume_mount v pod=ns/b"},
		{name: "unwanted: unpublish all, uncertain too", known: true,
			actual: cache.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted", "b=Uncertain", "c=NotMounted")},
			want:   "volume_unmount v pod=ns/a; volume_unmount v pod=ns/b"},
		{name: "unwanted and unpublished: unstage", known: true, actual: staged, want: "unmount_device v"},
		{name: "unwanted, device uncertain: unstage", known: true, actual: cache.ActualVolume{Attached: true, DeviceState: cache.Uncertain}, want: "unmount_device v"},
		{name: "unwanted and unstaged: done", known: true, actual: cache.ActualVolume{Attached: true}, wantDone: true},
		{name: "unknown and unwanted: done", wantDone: true},
		{name: "ephemeral: no attach, no stage", desired: []cache.PodVolume{pv("a")}, spec: cache.VolumeSpec{Ephemeral: true}, want: "volume_mount v pod=ns/a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.actual.Pods == nil {
				tc.actual.Pods = map[types.UID]cache.PodMount{}
			}
			actions, done := plan(vol, tc.desired, tc.spec, tc.actual, tc.known)
			var got []string
			for _, a := range actions {
				got = append(got, a.String())
			}
			if strings.Join(got, "; ") != tc.want || done != tc.wantDone {
				t.Fatalf("plan = %q done=%v, want %q done=%v", strings.Join(got, "; "), done, tc.want, tc.wantDone)
			}
		})
	}
}
