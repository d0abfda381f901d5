package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager"
)

// The demo's pods carry one volume of every kind nodevol mounts that works
// without a cluster's extras: the CSI claim provision makes ("data"), an
// inline CSI volume of the same driver ("inline"), an emptyDir on disk
// ("scratch") and in memory ("mem"), a hostPath ("host"), a configMap
// ("config"), a secret ("creds"), a downwardAPI volume ("podinfo") and the
// projected volume the API server gives every pod ("kube-api-access").

// demoNS is the namespace of the demo's pods and objects.
const demoNS = "demo"

// demoObjects creates what the pods' volumes read: the configMaps settings
// and kube-root-ca.crt and the secret db; service account tokens are
// answered by a reactor, as an API server's TokenRequest would.
func demoObjects(ctx context.Context, client *fake.Clientset) error {
	var issued atomic.Int64
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		life := time.Hour
		if e := tr.Spec.ExpirationSeconds; e != nil {
			life = time.Duration(*e) * time.Second
		}
		tr.Status = authenticationv1.TokenRequestStatus{Token: fmt.Sprintf("demo-token-%d", issued.Add(1)),
			ExpirationTimestamp: metav1.NewTime(time.Now().Add(life))}
		return true, tr, nil
	})
	for _, cm := range []*v1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "settings"}, Data: map[string]string{"app.conf": "greeting = hello\n"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\n(demo)\n-----END CERTIFICATE-----\n"}},
	} {
		if _, err := client.CoreV1().ConfigMaps(demoNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "db"}, Data: map[string][]byte{"password": []byte("hunter2")}}
	_, err := client.CoreV1().Secrets(demoNS).Create(ctx, s, metav1.CreateOptions{})
	return err
}

// demoNode is the demo's Node: allocatable memory sizes the memory
// emptyDir's tmpfs as the kubelet sizes it.
func demoNode(name string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
		Status:     v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}},
	}
}

// demoPod is pod name with a volume of every kind (see above): claim is
// its CSI claim, driverName the inline volume's driver, hostDir its
// hostPath (DirectoryOrCreate).
func demoPod(name, node, claim, driverName, hostDir string) *v1.Pod {
	expiry := int64(3607)
	vols := []v1.Volume{
		claimVolume("data", claim),
		{Name: "inline", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: driverName,
			VolumeAttributes: map[string]string{driver.SizeAttribute: "64Mi"}}}},
		emptyDirVolume("scratch", v1.StorageMediumDefault, ""),
		emptyDirVolume("mem", v1.StorageMediumMemory, "16Mi"),
		hostPathVolume("host", hostDir, v1.HostPathDirectoryOrCreate),
		{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}},
		{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "db"}}},
		{Name: "podinfo", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}},
			{Path: "labels", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}}}}}},
		{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		}}}},
	}
	spec := csitest.PodSpec{Node: node, ServiceAccount: "default"}
	for _, v := range vols {
		spec.Volumes = append(spec.Volumes, csitest.PodVolume{Name: v.Name, Source: v.VolumeSource})
	}
	pod := csitest.Pod(demoNS, name, spec)
	pod.Labels = map[string]string{"app": "demo"}
	return pod
}

func emptyDirVolume(name string, medium v1.StorageMedium, sizeLimit string) v1.Volume {
	src := &v1.EmptyDirVolumeSource{Medium: medium}
	if sizeLimit != "" {
		q := resource.MustParse(sizeLimit)
		src.SizeLimit = &q
	}
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: src}}
}

func hostPathVolume(name, path string, t v1.HostPathType) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path, Type: &t}}}
}

func claimVolume(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// demoWritable are the volumes the demo writes into and reads back;
// demoFiles what it reads from the others, by volume, file and a part of
// the content it must have (the token's is not known in advance).
var (
	demoWritable = []string{"data", "inline", "scratch", "mem", "host"}
	demoFiles    = map[string]map[string]string{
		"config":          {"app.conf": "greeting = hello"},
		"creds":           {"password": "hunter2"},
		"podinfo":         {"labels": `app="demo"`},
		"kube-api-access": {"token": "demo-token-", "ca.crt": "(demo)", "namespace": demoNS},
	}
)

// mountAllKinds mounts the pod's volumes, writes a file into each
// writable one and reads it back, and reads the files the others must
// have, as the pod's container would. It returns a line per volume.
func mountAllKinds(ctx context.Context, vm *volumemanager.VolumeManager, pod *v1.Pod, describe func(podvol.MountedVolume) string) ([]string, error) {
	if err := vm.AddPod(pod); err != nil {
		return nil, err
	}
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pod); err != nil {
		return nil, err
	}
	vols := map[string]podvol.MountedVolume{}
	for _, v := range vm.GetMountedVolumesForPod(pod.UID) {
		vols[v.SpecName] = v
	}
	if len(vols) != len(pod.Spec.Volumes) {
		return nil, fmt.Errorf("pod %s: %d volumes mounted, want %d", pod.Name, len(vols), len(pod.Spec.Volumes))
	}
	for _, name := range demoWritable {
		file := filepath.Join(vols[name].Path, "hello.txt")
		want := []byte("hello from " + pod.Name + "\n")
		if err := os.WriteFile(file, want, 0o644); err != nil {
			return nil, fmt.Errorf("pod %s: writing into volume %q: %w", pod.Name, name, err)
		}
		if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, want) {
			return nil, fmt.Errorf("pod %s: reading back %s: %q, %v", pod.Name, file, got, err)
		}
	}
	for name, files := range demoFiles {
		for f, want := range files {
			got, err := os.ReadFile(filepath.Join(vols[name].Path, f))
			if err != nil || !strings.Contains(string(got), want) {
				return nil, fmt.Errorf("pod %s: volume %q: file %s: %q, %v; want it to hold %q", pod.Name, name, f, got, err, want)
			}
		}
	}
	var lines []string
	for _, v := range pod.Spec.Volumes {
		lines = append(lines, fmt.Sprintf("%-16s %s", v.Name, describe(vols[v.Name])))
	}
	return lines, nil
}
