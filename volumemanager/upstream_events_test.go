package volumemanager_test

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager"
	"github.com/nodevol/nodevol/volumemanager/vmtest"
)

// TestPodConditionsFailedMountEvent is upstream's node conformance spec
// "Pod conditions ... a pod failing to mount volumes" (test/e2e_node/
// pod_conditions_test.go) on nodevol's public API: a pod whose configMap,
// or whose secret, does not exist gets a FailedMount event, written
// through a client-go event broadcaster to the (fake) API, whose message
// holds "MountVolume.SetUp failed for volume" as the spec waits for: the
// kubelet's whole text, the pod's name of the volume and the object's,
// in the singular as the kubelet's object managers say it.
func TestPodConditionsFailedMountEvent(t *testing.T) {
	tests := []struct {
		name   string
		volume v1.Volume
		mount  string
		want   string
	}{
		{"ConfigMap", v1.Volume{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm-that-unblock-pod-condition"}}}}, "/config",
			`MountVolume.SetUp failed for volume "cm" : configmap "cm-that-unblock-pod-condition" not found`},
		{"Secret", v1.Volume{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{
			SecretName: "secret-that-unblock-pod-condition"}}}, "/secret",
			`MountVolume.SetUp failed for volume "secret" : secret "secret-that-unblock-pod-condition" not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := vmtest.NewEnv(t, vmtest.EnvOptions{Configure: func(cfg *volumemanager.Config) {
				broadcaster := record.NewBroadcaster()
				broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.KubeClient.CoreV1().Events("")})
				t.Cleanup(broadcaster.Shutdown)
				cfg.EventRecorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: cfg.NodeName})
			}})
			pod := csitest.Pod("ns", "pod-"+strings.ToLower(tt.name), csitest.PodSpec{})
			pod.Spec.Volumes = []v1.Volume{tt.volume}
			pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: tt.volume.Name, MountPath: tt.mount}}
			env.Manager.AddPod(pod)

			// The spec's wait: events of the namespace, selected by
			// involvedObject and reason, one whose message holds its text.
			var found *v1.Event
			err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				list, err := env.Client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				for i, ev := range list.Items {
					o := ev.InvolvedObject
					if o.Kind == "Pod" && o.Name == pod.Name && o.Namespace == "ns" && ev.Reason == "FailedMount" &&
						strings.Contains(ev.Message, "MountVolume.SetUp failed for volume") {
						found = &list.Items[i]
						return true, nil
					}
				}
				return false, nil
			})
			if err != nil {
				t.Fatalf("no FailedMount event with \"MountVolume.SetUp failed for volume\" on pod %s: %v", pod.Name, err)
			}
			if found.Message != tt.want || found.Type != v1.EventTypeWarning || found.Source.Component != "kubelet" {
				t.Errorf("event %s %s %q from %v\nwant    Warning FailedMount %q from the kubelet", found.Type, found.Reason, found.Message, found.Source, tt.want)
			}
			// The pod waits: a missing object may appear.
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := env.Manager.WaitForAttachAndMount(ctx, pod); err == nil || !strings.Contains(err.Error(), tt.volume.Name) {
				t.Errorf("WaitForAttachAndMount = %v, want a wait error naming volume %s", err, tt.volume.Name)
			}
		})
	}
}
