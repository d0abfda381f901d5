package volumemanager

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestPluginRegistration: with Config.PluginRegistration, a driver that a
// registrar announces in {root}/plugins_registry is registered by Run and
// a pod waiting for it mounts; the registrar's socket going deregisters it.
func TestPluginRegistration(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	root := csitest.SocketDir(t) // the registrar's socket goes in root/plugins_registry
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), PluginRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()

	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod) // waits for the driver
	dir := filepath.Join(root, "plugins_registry")
	eventually(t, "registration directory created", func() bool { _, err := os.Stat(dir); return err == nil })
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	if s, err := reg.WaitForStatus(ctx, 1); err != nil || !s.Registered {
		t.Fatalf("registration status %+v, %v; want registered", s, err)
	}
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := vm.Plugins(); len(got) != 1 || got[0].Name != drv.DriverName() {
		t.Errorf("Plugins() = %+v, want the driver", got)
	}
	reg.Stop()
	eventually(t, "driver deregistered", func() bool {
		_, err := vm.Drivers().Client(drv.DriverName())
		return err != nil && len(vm.Plugins()) == 0
	})
}
