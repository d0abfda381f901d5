package pluginmanager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/registration"
)

// TestCSIRegistration runs the whole registration flow: a registrar socket
// in plugins_registry, the manager, the CSI registration handler, an
// in-process CSI driver and the fake clientset.
func TestCSIRegistration(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := csitest.SocketDir(t)
	regDir := filepath.Join(root, "plugins_registry")

	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-1"}})
	registry := csi.NewRegistry(csi.RegistryOptions{})
	t.Cleanup(func() { registry.Close() })
	handler, err := registration.New(registration.Config{Registry: registry, KubeClient: client, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := pluginmanager.New(pluginmanager.Options{
		Dir:            regDir,
		Handlers:       map[string]pluginmanager.Handler{registerapi.CSIPlugin: handler},
		InitialBackoff: 10 * time.Millisecond,
		MaxBackoff:     100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v", err)
		}
	}()
	poll(t, "registration directory", func() bool { _, err := os.Stat(regDir); return err == nil })

	driverDir := filepath.Join(root, "plugins", "drv")
	if err := os.MkdirAll(driverDir, 0o750); err != nil {
		t.Fatal(err)
	}
	driver, err := csitest.Start(driverDir, csitest.Options{DriverName: "drv.example.com", NodeID: "drv-node-1", MaxVolumes: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(driver.Stop)
	regCfg := csitest.RegistrarConfig{Dir: regDir, DriverName: "drv.example.com", Endpoint: driver.Endpoint(), Versions: []string{"1.0.0"}}

	r := startReg(t, regCfg)
	if s := status(t, r, 1); !s.Registered {
		t.Fatalf("status = %+v, want registered", s)
	}
	checkRecorded(t, client, registry, true)

	// A registrar restart re-registers the driver.
	r.Stop()
	r = startReg(t, regCfg)
	if s := status(t, r, 1); !s.Registered {
		t.Fatalf("status after restart = %+v, want registered", s)
	}
	checkRecorded(t, client, registry, true)

	// A second registrar claiming the same driver, and a hostile name, are
	// refused; the registered driver is undisturbed.
	dup := regCfg
	dup.SocketName = "dup-reg.sock"
	dupReg := startReg(t, dup)
	if s := status(t, dupReg, 1); s.Registered || !strings.Contains(s.Error, "already registered") {
		t.Errorf("duplicate registrar status = %+v, want a refusal", s)
	}
	hostile := regCfg
	hostile.DriverName, hostile.SocketName = "../x", "hostile-reg.sock"
	if s := status(t, startReg(t, hostile), 1); s.Registered || !strings.Contains(s.Error, "invalid") {
		t.Errorf("hostile registrar status = %+v, want a refusal", s)
	}
	checkRecorded(t, client, registry, true)

	// The manager retries the refused duplicate (backoff), and it is refused
	// only while r holds the driver: once r goes it would register the
	// driver again. Stop it first. Its socket is removed before r's, so the
	// manager handles its removal (cancelling any retry in flight, which then
	// cannot register) before it starts deregistering r.
	dupReg.Stop()

	// The socket goes: the driver is deregistered.
	r.Stop()
	poll(t, "deregistration from the manager, registry, Node and CSINode", func() bool {
		inRegistry, annotated, listed := recorded(client, registry)
		return len(m.Plugins()) == 0 && !inRegistry && !annotated && !listed
	})
}

func startReg(t *testing.T, cfg csitest.RegistrarConfig) *csitest.Registrar {
	t.Helper()
	r, err := csitest.StartRegistrar(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func status(t *testing.T, r *csitest.Registrar, n int) csitest.RegistrarStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := r.WaitForStatus(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// recorded reports whether drv.example.com is in the registry, in the
// Node's annotation and in the CSINode.
func recorded(client *fake.Clientset, registry *csi.Registry) (inRegistry, annotated, listed bool) {
	ctx := context.Background()
	_, err := registry.Client("drv.example.com")
	inRegistry = err == nil
	node, _ := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	annotated = strings.Contains(node.Annotations[registration.NodeIDAnnotation], `"drv.example.com":"drv-node-1"`)
	if cn, err := client.StorageV1().CSINodes().Get(ctx, "node-1", metav1.GetOptions{}); err == nil {
		for _, d := range cn.Spec.Drivers {
			listed = listed || (d.Name == "drv.example.com" && d.NodeID == "drv-node-1" && *d.Allocatable.Count == 7)
		}
	}
	return inRegistry, annotated, listed
}

func checkRecorded(t *testing.T, client *fake.Clientset, registry *csi.Registry, want bool) {
	t.Helper()
	inRegistry, annotated, listed := recorded(client, registry)
	if inRegistry != want || annotated != want || listed != want {
		t.Errorf("driver recorded: registry %v, annotation %v, CSINode %v; want %v", inRegistry, annotated, listed, want)
	}
}
