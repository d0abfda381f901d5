package pluginmanager_test

import (
	"context"
	"log"

	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/registration"
	"github.com/nodevol/nodevol/pluginmanager"
)

// The pieces Config.PluginRegistration wires, for an agent that wires them
// itself: CSI drivers announced in the registration directory are
// registered in drivers and recorded on the Node and its CSINode. (No
// Output: it needs a registrar and an API server; the volumemanager
// example of Config.PluginRegistration runs the same flow.)
func ExampleNew() {
	var (
		ctx     context.Context      // the agent's context
		client  kubernetes.Interface // the agent's client
		drivers *csi.Registry        // e.g. vm.Drivers()
	)
	handler, err := registration.New(registration.Config{
		Registry: drivers, KubeClient: client, NodeName: "node-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	m, err := pluginmanager.New(pluginmanager.Options{
		Dir:      "/var/lib/kubelet/plugins_registry",
		Handlers: map[string]pluginmanager.Handler{"CSIPlugin": handler},
	})
	if err != nil {
		log.Fatal(err)
	}
	go handler.Run(ctx) // keeps the CSINode: created at once, allocatable counts refreshed
	if err := m.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
