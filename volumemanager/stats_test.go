package volumemanager

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestVolumeStats: GetVolumeStats reports a pod's volumes by name; the
// kubelet_volume_stats_* gauges report them by claim, asking the driver
// once per period however often they are scraped.
func TestVolumeStats(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, GetVolumeStats: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	prom := prometheus.NewRegistry()
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: prom})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stats, err := vm.GetVolumeStats(ctx, pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := stats["data"]; !ok || s.CapacityBytes != csitest.DefaultCapacity || s.UsedBytes <= 0 {
		t.Errorf("GetVolumeStats = %+v, want volume data with capacity %d", stats, csitest.DefaultCapacity)
	}
	calls := drv.Calls("NodeGetVolumeStats")
	for i := 0; i < 3; i++ {
		fams, err := prom.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, f := range fams {
			if f.GetName() != "kubelet_volume_stats_capacity_bytes" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				found = l["namespace"] == "ns" && l["persistentvolumeclaim"] == "a" && m.GetGauge().GetValue() == float64(csitest.DefaultCapacity)
			}
		}
		if !found {
			t.Fatalf("scrape %d: no kubelet_volume_stats_capacity_bytes{namespace=ns,persistentvolumeclaim=a}", i)
		}
	}
	if got := drv.Calls("NodeGetVolumeStats") - calls; got != 1 {
		t.Errorf("3 scrapes asked the driver %d times, want 1", got)
	}
}

// TestVolumeStatsEveryKind: every kind the kubelet measures reports its
// usage (a CSI claim its driver's, an emptyDir, configMap, secret,
// downwardAPI and projected volume a du walk), and a hostPath none, as
// the kubelet's stats summary lists them.
func TestVolumeStatsEveryKind(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr.Status = authenticationv1.TokenRequestStatus{Token: "token-1", ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
		return true, tr, nil
	})
	e := newEnv(t, envOptions{client: client, driver: csitest.Options{GetVolumeStats: true}, objects: []runtime.Object{
		crashNodeObject(),
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "-----CA-----\n"}},
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"app.conf": "level: debug\n"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "token"}, Data: map[string][]byte{"password": []byte("s3cret")}},
	}})
	e.claim("a")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{ServiceAccount: "app", Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "a"},
		withConfigMap("config", "settings"),
		withSecret("creds", "token"),
		withDownwardLabels("info"),
		withKubeAPIAccess("kube-api-access-x7k2p"),
		{Name: "scratch", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "host", Source: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: t.TempDir()}}},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stats, err := e.vm.GetVolumeStats(ctx, pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"config", "creds", "data", "info", "kube-api-access-x7k2p", "scratch"}
	if got := slices.Sorted(maps.Keys(stats)); !slices.Equal(got, want) {
		t.Errorf("GetVolumeStats lists %v, want %v", got, want)
	}
	for _, name := range want {
		s, ok, err := e.vm.GetVolumeStatsFor(ctx, pod.UID, name)
		if err != nil || !ok || s.UsedBytes <= 0 || s.InodesUsed <= 0 || s.CapacityBytes <= 0 {
			t.Errorf("GetVolumeStatsFor(%s) = %+v, %v, %v; want used bytes and inodes", name, s, ok, err)
		}
	}
	if _, ok, err := e.vm.GetVolumeStatsFor(ctx, pod.UID, "host"); ok || err != nil {
		t.Errorf("GetVolumeStatsFor(host) = %v, %v; want none, as the kubelet's hostPath", ok, err)
	}
	e.unmount(pod)
}
