package volumemanager

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestNilDefaultModeDefaulted: a pod built in Go, whose configMap,
// secret, downwardAPI or projected volume has no defaultMode (the API
// server would have set 0644), is set up with the files the API server's
// default gives, alike for the four kinds, rather than failing.
func TestNilDefaultModeDefaulted(t *testing.T) {
	objects := []runtime.Object{
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"key": "value"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sec"}, Data: map[string][]byte{"key": []byte("value")}},
	}
	name := &v1.ObjectFieldSelector{FieldPath: "metadata.name"}
	for _, tc := range []struct {
		kind   string
		source v1.VolumeSource
	}{
		{"kubernetes.io~configmap", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
		{"kubernetes.io~secret", v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec"}}},
		{"kubernetes.io~downward-api", v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
			Items: []v1.DownwardAPIVolumeFile{{Path: "key", FieldRef: name}}}}},
		{"kubernetes.io~projected", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "key", FieldRef: name}}}}}}}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			e := newEnv(t, envOptions{objects: objects})
			pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "vol", Source: tc.source}}})
			if err := e.mount(pod, 10*time.Second); err != nil {
				t.Fatalf("a volume without defaultMode: %v", err)
			}
			file := filepath.Join(e.root, "pods", string(pod.UID), "volumes", tc.kind, "vol", "key")
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != 0o644 {
				t.Errorf("%s: mode %v, want -rw-r--r-- (the API server's default 0644)", file, got)
			}
			e.unmount(pod)
		})
	}
}
