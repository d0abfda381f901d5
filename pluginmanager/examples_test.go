package pluginmanager_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/registration"
)

// The pieces Config.PluginRegistration wires, for an agent that wires them
// itself: a CSI driver announced in the registration directory (here by
// the test kit's Registrar, as node-driver-registrar announces it) is
// registered in drivers and recorded on the Node. An agent passes its own
// client, its root's plugins_registry and vm.Drivers().
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Under /tmp: a registrar's socket path must fit in 108 bytes.
	root, err := csitest.ShortTempDir("nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	drv, err := csitest.Start("", csitest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Stop()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	drivers := csi.NewRegistry(csi.RegistryOptions{})
	defer drivers.Close()

	handler, err := registration.New(registration.Config{
		Registry: drivers, KubeClient: client, NodeName: "node-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	dir := filepath.Join(root, "plugins_registry")
	m, err := pluginmanager.New(pluginmanager.Options{
		Dir:      dir,
		Handlers: map[string]pluginmanager.Handler{"CSIPlugin": handler},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- handler.Run(runCtx) }() // keeps the CSINode
	go func() { done <- m.Run(runCtx) }()

	if err := os.MkdirAll(dir, 0o750); err != nil {
		log.Fatal(err)
	}
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Stop()
	st, err := reg.WaitForStatus(ctx, 1) // NotifyRegistrationStatus
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("registered:", st.Registered, drivers.Drivers())
	n, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("node annotation:", n.Annotations["csi.volume.kubernetes.io/nodeid"])

	stop()
	for range 2 {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			log.Fatal(err)
		}
	}
	// Output:
	// registered: true [csitest.nodevol.io]
	// node annotation: {"csitest.nodevol.io":"node-1"}
}
