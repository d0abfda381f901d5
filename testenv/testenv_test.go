package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// TestSmoke starts the environment, creates a namespace, a CSIDriver, a PV,
// a bound PVC and a pod through the admin's clientset, sees them all through
// an informer, deletes the pod with grace period 0, stops, and checks that
// no etcd or kube-apiserver is left and their ports are free.
func TestSmoke(t *testing.T) {
	begin := time.Now()
	env := StartT(t, Options{})
	t.Logf("etcd and kube-apiserver ready after %v", time.Since(begin).Round(time.Millisecond))
	ctx := t.Context()
	client := kubernetes.NewForConfigOrDie(env.Config())

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	driver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: "loop.csi.nodevol.io"},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: new(false)},
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: "smoke", Name: "claim-1"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: driver.Name, VolumeHandle: "vol-1"},
			},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "smoke", Name: "claim-1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			},
			VolumeName:       pv.Name,
			StorageClassName: new(""),
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "smoke", Name: "pod-1"},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name},
			}}},
		},
	}
	must(t, "create namespace", func() error {
		_, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		return err
	})
	must(t, "create CSIDriver", func() error {
		_, err := client.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{})
		return err
	})
	must(t, "create PV", func() error {
		_, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		return err
	})
	must(t, "create PVC", func() error {
		_, err := client.CoreV1().PersistentVolumeClaims("smoke").Create(ctx, pvc, metav1.CreateOptions{})
		return err
	})
	must(t, "create pod", func() error {
		_, err := client.CoreV1().Pods("smoke").Create(ctx, pod, metav1.CreateOptions{})
		return err
	})

	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods()
	pvcs := factory.Core().V1().PersistentVolumeClaims()
	pvs := factory.Core().V1().PersistentVolumes()
	drivers := factory.Storage().V1().CSIDrivers()
	synced := []cache.InformerSynced{pods.Informer().HasSynced, pvcs.Informer().HasSynced, pvs.Informer().HasSynced, drivers.Informer().HasSynced}
	informerCtx, stopInformers := context.WithCancel(ctx)
	defer func() { stopInformers(); factory.Shutdown() }()
	factory.Start(informerCtx.Done())
	if !cache.WaitForCacheSync(informerCtx.Done(), synced...) {
		t.Fatal("informers did not sync")
	}
	got := map[string]int{}
	if l, err := pods.Lister().List(labels.Everything()); err == nil {
		got["pods"] = len(l)
	}
	if l, err := pvcs.Lister().List(labels.Everything()); err == nil {
		got["pvcs"] = len(l)
	}
	if l, err := pvs.Lister().List(labels.Everything()); err == nil {
		got["pvs"] = len(l)
	}
	if l, err := drivers.Lister().List(labels.Everything()); err == nil {
		got["csidrivers"] = len(l)
	}
	if want := map[string]int{"pods": 1, "pvcs": 1, "pvs": 1, "csidrivers": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("informers list %v, want %v", got, want)
	}
	// The apiserver filled in defaults the fake clientset would not.
	if p, err := pods.Lister().Pods("smoke").Get("pod-1"); err != nil || p.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		t.Fatalf("pod-1 from the lister: %v, restartPolicy %q; want the default Always", err, p.Spec.RestartPolicy)
	}

	must(t, "delete pod with grace 0", func() error {
		return client.CoreV1().Pods("smoke").Delete(ctx, "pod-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	})
	if _, err := client.CoreV1().Pods("smoke").Get(ctx, "pod-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod-1 after a delete with grace 0: %v, want NotFound", err)
	}
	waitFor(t, "the informer to see pod-1 deleted", func() bool {
		_, err := pods.Lister().Pods("smoke").Get("pod-1")
		return apierrors.IsNotFound(err)
	})
	stopInformers()
	factory.Shutdown()

	pids := []int{env.etcd.cmd.Process.Pid, env.apiserver.cmd.Process.Pid}
	ports := []int{env.apiPort, portOf(t, env.etcdURL)}
	dir := env.dir
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	for _, pid := range pids {
		if left := childAlive(pid); left != "" {
			t.Errorf("after Stop, process %d is still there: %s", pid, left)
		}
	}
	for _, port := range ports {
		l, err := net.Listen("tcp", hostPort(port))
		if err != nil {
			t.Errorf("after Stop, port %d is not free: %v", port, err)
			continue
		}
		l.Close()
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, %s: %v, want it removed", dir, err)
	}
}

// TestRestartAPIServer stops the apiserver alone and starts it again: a
// client made before keeps working and sees what was written before.
func TestRestartAPIServer(t *testing.T) {
	env := StartT(t, Options{})
	ctx := t.Context()
	client := kubernetes.NewForConfigOrDie(env.Config())
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.StopAPIServer()
	if _, err := client.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err == nil {
		t.Fatal("GET succeeded while the apiserver was stopped")
	}
	start := time.Now()
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver ready again after %v", time.Since(start).Round(time.Millisecond))
	if _, err := client.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("GET after the restart: %v", err)
	}
}

func must(t *testing.T, what string, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func portOf(t *testing.T, url string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// childAlive describes process pid if it still exists as a child of this
// test process (a zombie included), or returns "".
func childAlive(pid int) string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
	i := bytes.LastIndexByte(stat, ')')
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
		return "" // the pid was reused by an unrelated process
	}
	return strings.TrimSpace(string(stat))
}
