package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/registrar/sidecar"
	"github.com/nodevol/nodevol/volumemanager"
)

// registrarCommand is the hidden subcommand that runs the registrar, so
// that the demo can start it as a separate process, as a node runs
// node-driver-registrar beside the driver.
const registrarCommand = "registrar"

func runRegistrar(args []string) int { return sidecar.Main(args) }

// registrationDir is where drivers' registrars put their sockets, as with
// the kubelet (volumemanager's default Config.RegistrationDir).
func registrationDir(root string) string { return filepath.Join(root, "plugins_registry") }

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
