package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestRestartEndToEnd restarts the node agent with real volumes mounted:
// the new volume manager finds them on disk. The pod that is still there
// keeps its volume and data, untouched by the restart; the volume of the
// pod that went while the agent was down is kept until the pods are
// synced, then torn down; nothing is left.
func TestRestartEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	root, err := csitest.ShortTempDir("nv-rst-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	drv, err := startDemoDriver(ctx, root, node)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.stop()
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}))
	start := func() (*volumemanager.VolumeManager, func()) {
		vm, err := volumemanager.New(volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- vm.Run(runCtx) }()
		if err := vm.Drivers().Register(ctx, drv.name, drv.endpoint); err != nil {
			t.Fatal(err)
		}
		return vm, func() { stop(); <-ran }
	}

	vm, stop := start()
	pods, err := provision(ctx, client, drv, 2, node)
	if err != nil {
		t.Fatal(err)
	}
	paths := make([]string, len(pods))
	for i, p := range pods {
		if paths[i], err = mountAndUse(ctx, vm, p); err != nil {
			t.Fatal(err)
		}
	}
	stop() // the agent goes down; pods[1] is deleted meanwhile

	vm, stop = start()
	defer stop()
	vm.AddPod(pods[0])
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pods[0]); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(paths[0], "hello.txt")); err != nil || string(data) != "hello from pod-demo-0\n" {
		t.Fatalf("the kept pod's data after the restart: %q, %v", data, err)
	}
	if got := source(drv.mounter, paths[1]); got == "volume" {
		t.Fatalf("the gone pod's volume was unmounted before the pods were synced")
	}
	vm.MarkPodsSynced()
	if err := vm.WaitForUnmount(waitCtx, pods[1]); err != nil {
		t.Fatal(err)
	}
	deletePods(t, ctx, vm, []*v1.Pod{pods[0]})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}
