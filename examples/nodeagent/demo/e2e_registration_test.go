package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestRegistrationEndToEnd registers the loop driver as a real node does:
// the driver and a registrar run as separate processes, the registrar's
// socket appears in {root}/plugins_registry, nodevol registers the driver
// and records it on the Node and CSINode, and a pod's volume mounts
// through it. Both processes are killed and started again (a new socket):
// nodevol registers the driver again and the next pod mounts. The socket is
// removed: the driver is deregistered from nodevol and from the Node and
// CSINode.
func TestRegistrationEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	root, err := csitest.ShortTempDir("nv-reg-")
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
	defer func() { drv.stop() }()
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	vm, err := volumemanager.New(volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter, PluginRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	registrar, err := startDemoRegistrar(ctx, root, drv)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { registrar.stop() }()
	regSock := filepath.Join(registrationDir(root), drv.name+"-reg.sock")

	first := waitRegisteredAfter(t, ctx, vm, regSock, time.Time{})
	waitRecorded(t, ctx, client, node, drv.name, true)
	pods, err := provision(ctx, client, drv, 1, node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mountAndUse(ctx, vm, pods[0]); err != nil {
		t.Fatal(err)
	}
	deletePods(t, ctx, vm, pods)
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// A crash of both: the sockets stay behind, stale. Both start again.
	drv.kill()
	registrar.kill()
	if drv, err = startDemoDriver(ctx, root, node); err != nil {
		t.Fatal(err)
	}
	if registrar, err = startDemoRegistrar(ctx, root, drv); err != nil {
		t.Fatal(err)
	}
	waitRegisteredAfter(t, ctx, vm, regSock, first)
	waitRecorded(t, ctx, client, node, drv.name, true)
	again := csitest.Pod("demo", "again", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "demo-0"}}})
	vm.AddPod(again)
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, again); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(again.UID)
	if len(vols) != 1 {
		t.Fatalf("mounted volumes %+v, want 1", vols)
	}
	if data, err := os.ReadFile(filepath.Join(vols[0].Path, "hello.txt")); err != nil || string(data) != "hello from pod-demo-0\n" {
		t.Fatalf("data after the restart: %q, %v", data, err)
	}
	deletePods(t, ctx, vm, []*v1.Pod{again})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// The registration socket goes: the driver is deregistered everywhere.
	if err := os.Remove(regSock); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "driver deregistered from nodevol", func() (bool, error) {
		return !slices.Contains(vm.Drivers().Drivers(), drv.name) && len(vm.Plugins()) == 0, nil
	})
	waitRecorded(t, ctx, client, node, drv.name, false)
	registrar.stop()
	drv.stop()
	assertClean(t, drv, root)
}

// waitRegisteredAfter waits until the plugin manager has registered the
// plugin at sock later than after, and returns when.
func waitRegisteredAfter(t *testing.T, ctx context.Context, vm *volumemanager.VolumeManager, sock string, after time.Time) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, ctx, "registration of "+sock, func() (bool, error) {
		for _, p := range vm.Plugins() {
			if p.SocketPath == sock && p.RegisteredAt.After(after) {
				at = p.RegisteredAt
				return true, nil
			}
		}
		return false, nil
	})
	return at
}

// waitRecorded waits until the Node's node ID annotation and the CSINode
// list driver (want) or no longer do (!want).
func waitRecorded(t *testing.T, ctx context.Context, client *fake.Clientset, node, driver string, want bool) {
	t.Helper()
	eventually(t, ctx, "driver recorded on the Node and CSINode", func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ids := map[string]string{}
		if a, ok := n.Annotations[registration.NodeIDAnnotation]; ok {
			if err := json.Unmarshal([]byte(a), &ids); err != nil {
				return false, err
			}
		}
		_, annotated := ids[driver]
		listed := false
		cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false, err
		default:
			listed = slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver })
		}
		return annotated == want && listed == want, nil
	})
}

// eventually polls cond until it holds, fails or ctx ends. The state it
// waits for lives in another process or in the fake API server, which
// have nothing to wait on.
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
