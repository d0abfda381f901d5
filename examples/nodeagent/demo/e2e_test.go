package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/nodeagent/internal/agent"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestMain lets the test binary play the loop driver process, as the
// demo binary does, and the registrar; with agentMainEnv=1 in its
// environment it is the nodeagent command itself (agent.Main, what
// examples/nodeagent runs, with its command line), for the integration
// tests.
func TestMain(m *testing.M) {
	if os.Getenv(agentMainEnv) == "1" {
		os.Exit(agent.Main(os.Args[1:]))
	}
	if code, ok := runSubcommand(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestEndToEnd runs the volume manager against the loop driver as a
// separate process, with real ext4 volumes on loop devices and real mounts
// under a temporary root: pods mount, write and read; a new pod of the
// same claim finds the data (the volume was not reformatted); everything is
// torn down and nothing is left: no mount, loop device or directory.
func TestEndToEnd(t *testing.T) {
	roottest.Require(t)
	// A short root (under /tmp, whatever $TMPDIR is): the driver's socket
	// path must fit in 108 bytes.
	root, err := csitest.ShortTempDir("nv-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	drv, err := startDemoDriver(ctx, root, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	defer drv.stop()
	if !drv.real {
		t.Fatal("not the real loop driver")
	}
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}))
	vm, err := volumemanager.New(volumemanager.Config{NodeName: "node-1", KubeClient: client, RootDir: root, Mounter: drv.mounter})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	if err := vm.Drivers().Register(ctx, drv.name, drv.endpoint); err != nil {
		t.Fatal(err)
	}
	pods, err := provision(ctx, client, drv, 3, "node-1")
	if err != nil {
		t.Fatal(err)
	}

	paths := map[string]string{}
	for _, p := range pods {
		path, err := mountAndUse(ctx, vm, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := source(drv.mounter, path); !strings.HasPrefix(got, "ext4 on /dev/loop") {
			t.Fatalf("pod %s: %s is %q, want ext4 on a loop device", p.Name, path, got)
		}
		paths[p.Name] = path
	}
	deletePods(t, ctx, vm, pods[:1])

	// A second pod of the first claim sees what the first one wrote.
	// It runs with an fsGroup, which the loop driver leaves to nodevol.
	gid := int64(2000)
	again := csitest.Pod("demo", "again", csitest.PodSpec{FSGroup: &gid, Volumes: []csitest.PodVolume{{Name: "data", Claim: "demo-0"}}})
	vm.AddPod(again)
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, again); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(again.UID)
	if len(vols) != 1 {
		t.Fatalf("mounted volumes %+v", vols)
	}
	if data, err := os.ReadFile(filepath.Join(vols[0].Path, "hello.txt")); err != nil || string(data) != "hello from pod-demo-0\n" {
		t.Fatalf("data after remount: %q, %v", data, err)
	}
	for _, p := range []string{vols[0].Path, filepath.Join(vols[0].Path, "hello.txt")} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if gid := info.Sys().(*syscall.Stat_t).Gid; gid != 2000 || info.Mode().Perm()&0o060 != 0o060 {
			t.Errorf("%s: group %d, mode %v; want fsGroup 2000 with group read-write", p, gid, info.Mode())
		}
	}

	deletePods(t, ctx, vm, append(pods[1:], again))
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}

func deletePods(t *testing.T, ctx context.Context, vm *volumemanager.VolumeManager, pods []*v1.Pod) {
	t.Helper()
	for _, p := range pods {
		vm.DeletePod(p)
		waitCtx, done := context.WithTimeout(ctx, time.Minute)
		err := vm.WaitForUnmount(waitCtx, p)
		done()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// assertClean checks that nothing nodevol or the driver set up is left:
// no mount and no loop device under root, no pod volume or staging directory.
func assertClean(t *testing.T, drv *demoDriver, root string) {
	t.Helper()
	if left, err := mountsUnder(drv.mounter, root); err != nil || len(left) > 0 {
		t.Errorf("mounts left: %v %v", left, err)
	}
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		t.Fatalf("losetup -a: %v: %s", err, out)
	}
	if strings.Contains(string(out), root) {
		t.Errorf("loop devices left:\n%s", out)
	}
	for _, pattern := range []string{
		filepath.Join(root, "pods", "*", "volumes", "kubernetes.io~csi", "*"),
		filepath.Join(root, "plugins", "kubernetes.io", "csi", drv.name, "*"),
	} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("directories left: %v", m)
		}
	}
}
