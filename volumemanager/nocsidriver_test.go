package volumemanager

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestNoCSIDriverWaitError: a pod whose volume's driver has no CSIDriver
// object waits with an error that names the missing object and what the
// volume needs it for, not a VolumeAttachment "not found" alone, nor the
// lifecycle modes of an object that does not exist.
func TestNoCSIDriverWaitError(t *testing.T) {
	tests := []struct {
		name string
		pod  func(e *env) *v1.Pod
		want []string
	}{
		{"inline volume: Ephemeral needs a CSIDriver listing it",
			func(e *env) *v1.Pod {
				return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
					{Name: "scratch", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: e.drv.DriverName()}}},
				}})
			},
			[]string{`volume "scratch": `, "volume lifecycle mode Ephemeral not supported by driver " + csitest.DefaultDriverName +
				": CSIDriver " + csitest.DefaultDriverName + " not found in the API (an inline CSI volume needs one whose volumeLifecycleModes lists Ephemeral"}},
		{"PV: attached by default, and the wait says so",
			func(e *env) *v1.Pod {
				e.claim("data")
				return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
			},
			[]string{`volume "data": `, "it does not exist yet (CSIDriver " + csitest.DefaultDriverName +
				" not found in the API: without one a volume needs attaching, as with the kubelet"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{noCSIDriver: true})
			pod := tt.pod(e)
			if err := e.vm.AddPod(pod); err != nil {
				t.Fatal(err)
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			var last error
			eventually(t, "the missing CSIDriver in the wait error", func() bool {
				last = e.vm.WaitForAttachAndMount(done, pod)
				for _, w := range tt.want {
					if last == nil || !strings.Contains(last.Error(), w) {
						return false
					}
				}
				return true
			})
			if strings.Contains(last.Error(), "volumeLifecycleModes: [") {
				t.Errorf("wait error %q speaks of the lifecycle modes of a CSIDriver that does not exist", last)
			}
		})
	}
}
