package volumemanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

func TestGetExtraSupplementalGroupsForPod(t *testing.T) {
	e := newEnv(t, envOptions{})
	// claim with the volume GID annotation gid
	gidClaim := func(name, gid string) {
		pvc, pv := csitest.BoundClaim("ns", name, csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-" + name})
		pv.Annotations = map[string]string{"pv.beta.kubernetes.io/gid": gid}
		e.create(pvc, pv)
	}
	gidClaim("a", "1000")
	gidClaim("b", "2000")
	gidClaim("c", "not-a-number")
	gidClaim("d", "1000")
	e.claim("e")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "a", Claim: "a"},
		{Name: "b", Claim: "b"},
		{Name: "c", Claim: "c"},
		{Name: "d", Claim: "d"},
		{Name: "e", Claim: "e"},
	}})
	pod.Spec.SecurityContext = &v1.PodSecurityContext{SupplementalGroups: []int64{2000}}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.vm.GetExtraSupplementalGroupsForPod(pod); !slices.Equal(got, []int64{1000}) {
		t.Errorf("extra groups = %v, want [1000] (2000 is the pod's own, duplicates and garbage dropped)", got)
	}
	if got := e.vm.GetExtraSupplementalGroupsForPod(csitest.Pod("ns", "unknown", csitest.PodSpec{})); got != nil {
		t.Errorf("extra groups of an unknown pod = %v, want none", got)
	}
}

func TestWaitForAllPodsUnmount(t *testing.T) {
	e := newEnv(t, envOptions{})
	var pods []*v1.Pod
	for _, n := range []string{"a", "b"} {
		e.claim(n)
		p := csitest.Pod("ns", n, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: n}}})
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	// Still mounted: both are named in the error.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := e.vm.WaitForAllPodsUnmount(ctx, pods)
	cancel()
	if err == nil || !contains(err.Error(), "ns/a", "ns/b") {
		t.Fatalf("WaitForAllPodsUnmount of mounted pods = %v, want an error naming both", err)
	}
	for _, p := range pods {
		e.vm.DeletePod(p)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.vm.WaitForAllPodsUnmount(ctx, pods); err != nil {
		t.Fatal(err)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
