package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/registrar/sidecar"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/volumemanager"
)

// registrarCommand is the hidden subcommand that runs the registrar, so
// that the demo can start it as a separate process, as a node runs
// node-driver-registrar beside the driver.
const registrarCommand = "registrar"

func runRegistrar(args []string) int { return sidecar.Main(args) }

// registrationDir is where drivers' registrars put their sockets, as with
// the kubelet.
func registrationDir(root string) string { return filepath.Join(root, "plugins_registry") }

// registration is a running plugin manager.
type registration struct {
	manager *pluginmanager.Manager
	stop    func() // ends the manager and waits for it
}

// startRegistration turns plugin registration on: a plugin manager watches
// {root}/plugins_registry and registers the CSI drivers announced there in
// vm's driver registry, recording them on the Node and CSINode (when
// client is set), as the kubelet does.
func startRegistration(ctx context.Context, root string, client kubernetes.Interface, node string, vm *volumemanager.VolumeManager) (*registration, error) {
	handler, err := csiplugin.NewRegistrationHandler(csiplugin.RegistrationConfig{
		Registry:   vm.Drivers(),
		KubeClient: client,
		NodeName:   node,
	})
	if err != nil {
		return nil, err
	}
	pm, err := pluginmanager.New(pluginmanager.Options{
		Dir:      registrationDir(root),
		Handlers: map[string]pluginmanager.Handler{registerapi.CSIPlugin: handler},
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := pm.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			klog.FromContext(ctx).Error(err, "Plugin registration stopped")
		}
	}()
	return &registration{manager: pm, stop: func() { cancel(); <-done }}, nil
}

// registered returns a channel closed once driver is registered in vm.
func registered(vm *volumemanager.VolumeManager, driver string) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	check := func() {
		if _, err := vm.Drivers().Client(driver); err == nil {
			once.Do(func() { close(ch) })
		}
	}
	vm.Drivers().OnChange(func(name string) {
		if name == driver {
			check()
		}
	})
	check() // registered before OnChange was set
	return ch
}

// startDemoRegistrar announces drv through the registration directory:
// as a separate registrar process next to the real loop driver, in-process
// (the test kit's registrar, same wire API) next to the in-process driver.
func startDemoRegistrar(ctx context.Context, root string, drv *demoDriver) (*process, error) {
	dir := registrationDir(root)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	if !drv.real {
		r, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: drv.name, Endpoint: drv.endpoint})
		if err != nil {
			return nil, err
		}
		return &process{stop: r.Stop, kill: r.Stop}, nil
	}
	sock := filepath.Join(dir, drv.name+"-reg.sock")
	p, err := startSelf(ctx, filepath.Join(root, "registrar.log"), sock, registrarCommand,
		"--reg-path", dir, "--driver-name", drv.name, "--endpoint", drv.endpoint)
	if err != nil {
		return nil, fmt.Errorf("the registrar: %w", err)
	}
	return p, nil
}
