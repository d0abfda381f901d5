package volumemanager

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
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
				return csitest.Pod("ns", "p", csitest.WithInlineCSI("scratch", e.drv.DriverName(), false, nil))
			},
			[]string{`volume "scratch": `, "volume lifecycle mode Ephemeral not supported by driver " + csitest.DefaultDriverName +
				": CSIDriver " + csitest.DefaultDriverName + " not found in the API (an inline CSI volume needs one whose volumeLifecycleModes lists Ephemeral"}},
		{"PV: attached by default, and the wait says so",
			func(e *env) *v1.Pod {
				e.claim("data")
				return csitest.Pod("ns", "p", csitest.WithPVC("data", "data", false))
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

// TestNoCSIDriverSELinux: without a CSIDriver a CSI volume is not mounted
// with an SELinux context, as the kubelet decides (seLinuxMount false).
func TestNoCSIDriverSELinux(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	other := csitest.CSIDriver("other.example.com", false, csitest.DriverSELinuxMount())
	if err := indexer.Add(other); err != nil {
		t.Fatal(err)
	}
	r := &resolver{csiDrivers: storagelisters.NewCSIDriverLister(indexer)}
	for _, tt := range []struct {
		driver string
		want   bool
	}{{csitest.DefaultDriverName, false}, {"other.example.com", true}} {
		got, err := r.seLinuxSupport(&podvol.VolumeSpec{Driver: tt.driver})
		if err != nil || got != tt.want {
			t.Errorf("seLinuxSupport(%s) = %v, %v; want %v", tt.driver, got, err, tt.want)
		}
	}
}
