package main

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager"
)

// startE2E makes a root directory for a root end-to-end test and starts
// the loop driver on it. At the end of the test (after its volume manager
// has stopped) whatever a failed test left mounted or attached under the
// root is unmounted and detached, the driver is stopped and the root is
// removed: a failure does not leak mounts or loop devices.
func startE2E(t *testing.T, ctx context.Context, prefix, node string) (string, *demoDriver) {
	t.Helper()
	root, err := csitest.ShortTempDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := startDemoDriver(ctx, root, node)
	if err != nil {
		os.RemoveAll(root)
		t.Fatal(err)
	}
	t.Cleanup((&holdEnv{t: t, root: root, drv: drv}).cleanup)
	if !drv.real {
		t.Fatal("the loop driver is needed (root)")
	}
	return root, drv
}

// runVolumeManager starts a volume manager on cfg, runs it until the end
// of the test, and registers the driver (name, endpoint) with it.
func runVolumeManager(t *testing.T, ctx context.Context, cfg volumemanager.Config, name, endpoint string) *volumemanager.VolumeManager {
	t.Helper()
	vm, _ := startVolumeManager(t, ctx, cfg, name, endpoint)
	return vm
}

// startVolumeManager is runVolumeManager for a test that drops the manager
// before its end (a crash): stop cancels Run's context and waits for Run
// to return. stop may be called more than once; it is called at the end of
// the test if it has not been.
func startVolumeManager(t *testing.T, ctx context.Context, cfg volumemanager.Config, name, endpoint string) (*volumemanager.VolumeManager, func()) {
	t.Helper()
	vm, err := volumemanager.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	stop := sync.OnceFunc(func() { cancel(); <-ran })
	t.Cleanup(stop)
	if err := vm.Drivers().Register(ctx, name, endpoint); err != nil {
		t.Fatal(err)
	}
	return vm, stop
}
