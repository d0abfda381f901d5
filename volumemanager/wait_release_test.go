package volumemanager

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestWaitKeepsNoChannel: however a wait ends (mounted, unmounted, a
// final error, its context done), it gives back the channels it waited on:
// kept, each pod would hold them for as long as it runs.
func TestWaitKeepsNoChannel(t *testing.T) {
	pvcHost, pvHost := csitest.BoundClaim("ns", "host", csitest.PVSpec{Driver: "unused", Handle: "h"})
	pvHost.Spec.CSI = nil
	pvHost.Spec.ISCSI = &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{name: "mounted, then unmounted", run: func(t *testing.T, e *env) {
			e.claim("vol")
			pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
			if err := e.mount(pod, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			e.unmount(pod)
		}},
		{name: "final error", run: func(t *testing.T, e *env) {
			e.create(pvcHost, pvHost)
			pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "host"}}})
			if err := e.mount(pod, 10*time.Second); err == nil {
				t.Fatal("WaitForAttachAndMount succeeded for a PV no plugin handles")
			}
		}},
		{name: "context done", run: func(t *testing.T, e *env) {
			// A claim that does not exist (yet): the volume cannot mount
			// before the wait looks, and within the grace period its error
			// is not final, so only the context ends the wait.
			pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "later"}}})
			if err := e.vm.AddPod(pod); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := e.vm.WaitForAttachAndMount(ctx, pod); err == nil {
				t.Fatal("WaitForAttachAndMount succeeded with its context done before the mount")
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			tt.run(t, e)
			held := e.vm.loop.PodErrorWaiters()
			if held != 0 {
				t.Errorf("%d pods keep a channel for their errors after the wait", held)
			}
		})
	}
}
