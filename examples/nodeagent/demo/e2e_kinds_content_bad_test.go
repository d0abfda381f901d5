package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/volumemanager"
)

func configMapVolume(name, configMap string, items ...v1.KeyToPath) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: v1.LocalObjectReference{Name: configMap}, Items: items}}}
}

// TestAllKindsBadContent gives the volume manager pods whose one volume,
// "bad", a configMap, secret or projected volume, cannot be written, and
// checks that WaitForAttachAndMount says so, naming the pod, the volume,
// the object and the cause, final only where no change of an object can
// mend it (an item path that leaves the volume: the pod's spec), retried
// otherwise (a configMap key "..", which the configMap may lose; a missing
// configMap, which may come; a token the API server refuses, which it may
// grant): nothing is mounted or written for any of them. The missing
// configMap, created, is then mounted with its file.
func TestAllKindsBadContent(t *testing.T) {
	e := newKindsEnv(t, "nv-kindcb-")
	tokens := e.contentObjects()
	tokens.refuse["denied"] = true
	evil := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "evil"}, Data: map[string]string{"..": "up", "ok": "fine"}}
	if _, err := e.client.CoreV1().ConfigMaps(kindsNS).Create(e.ctx, evil, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vm, _, _ := e.start()
	for i, c := range []struct {
		name, sa string
		vol      v1.Volume
		final    bool
		object   string
		cause    string
	}{
		{"configMap key ..", "", configMapVolume("bad", "evil"), false, "configmap demo/evil", `key "..": `},
		{"configMap item path ..", "", configMapVolume("bad", "evil", v1.KeyToPath{Key: "ok", Path: "../escape"}), true, "configMap volume", `items[0] (key "ok"): `},
		{"token refused", "denied", withName(kubeAPIAccess(), "bad"), false, "service account demo/denied",
			`serviceaccounts "denied" is forbidden: the node may not request a token of this service account`},
		{"configMap missing", "", configMapVolume("bad", "absent"), false, `configmap "absent"`, `configmap "absent" not found`},
	} {
		pod := kindsPod(fmt.Sprintf("bad-%d", i), c.vol)
		if c.sa != "" {
			pod.Spec.ServiceAccountName = c.sa
		}
		err := waitCause(t, e.ctx, vm, pod, c.cause, c.final)
		if err == nil {
			t.Errorf("%s: the pod's volumes were mounted", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, s := range []string{"pod " + kindsNS + "/" + pod.Name, `volume "bad"`, c.object, c.cause} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error does not say %s: %v", c.name, s, err)
			}
		}
		if got := errors.Is(err, volumemanager.ErrFinal); got != c.final {
			t.Errorf("%s: final %v, want %v: %v", c.name, got, c.final, err)
		}
		if !c.final && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: the wait did not run out: %v", c.name, err)
		}
		e.checkMounts(c.name, nil)
		e.checkTree(c.name, nil)
		if c.name == "configMap missing" {
			e.mendMissing(vm, pod)
		}
		deletePods(t, e.ctx, vm, []*v1.Pod{pod})
	}
	for _, dir := range []string{filepath.Join(e.root, "escape"), filepath.Join(e.root, "pods", "escape")} {
		if exists(dir) {
			t.Errorf("%s: written outside a volume", dir)
		}
	}
}

func withName(v v1.Volume, name string) v1.Volume {
	v.Name = name
	return v
}

// mendMissing creates the configMap absent that the pod's volume "bad"
// waits for: the pod mounts, with its file.
func (e *kindsEnv) mendMissing(vm *volumemanager.VolumeManager, pod *v1.Pod) {
	e.t.Helper()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "absent"}, Data: map[string]string{"key": "here now"}}
	if _, err := e.client.CoreV1().ConfigMaps(kindsNS).Create(e.ctx, cm, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.mountAll(vm, pod)
	vol := e.volumePath(pod, "kubernetes.io~configmap", "bad")
	checkFile(e.t, "the configMap created", filepath.Join(vol, "key"), "here now")
	e.checkMounts("the configMap created", nil)
}

// TestAllKindsOptionalSecret mounts a pod whose optional secret does not
// exist: an empty volume, as the kubelet writes one (a tmpfs of the
// node's allocatable memory, the pod declaring no limit, holding ..data
// and an empty timestamped directory); the secret, created, then fills it.
func TestAllKindsOptionalSecret(t *testing.T) {
	e := newKindsEnv(t, "nv-kindco-")
	e.contentObjects()
	vm, _, _ := e.start()
	pod := kindsPod("optional", v1.Volume{Name: "maybe", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{
		SecretName: "nosuch", Optional: ptrTo(true), DefaultMode: ptrTo[int32](0o644)}}})
	e.mountAll(vm, pod)
	vol := e.volumePath(pod, "kubernetes.io~secret", "maybe")
	e.checkMounts("mounted", map[string]wantMount{vol: {fstype: "tmpfs", opt: "size=8388608k"}}) // 8Gi
	version := e.dataTarget(vol)
	if names := dirNames(e.t, vol); !slices.Equal(names, []string{version, "..data"}) && !slices.Equal(names, []string{"..data", version}) {
		e.t.Errorf("the optional secret's volume: entries %v, want ..data and %s", names, version)
	}
	if names := dirNames(e.t, filepath.Join(vol, version)); len(names) != 0 {
		e.t.Errorf("the optional secret's version %s: %v, want it empty", version, names)
	}
	e.checkOwned("the optional secret's volume", filepath.Join(vol, version), os.ModeDir|os.ModeSetgid|0o755)
	e.checkTree("mounted", []string{"pods/" + string(pod.UID) + "/plugins/kubernetes.io~empty-dir/wrapped_maybe/ready",
		rel(e.root, vol) + "/"})

	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "nosuch"}, Data: map[string][]byte{"key": []byte("now it is")}}
	if _, err := e.client.CoreV1().Secrets(kindsNS).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the created secret in the volume", time.Minute, func() bool {
		data, err := os.ReadFile(filepath.Join(vol, "key"))
		return err == nil && string(data) == "now it is"
	})
	deletePods(t, e.ctx, vm, []*v1.Pod{pod})
	e.checkMounts("deleted", nil)
}

// dirNames lists dir's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
