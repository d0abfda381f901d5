package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager"
)

// loopDriverCommand is the hidden subcommand that runs the loop driver, so
// that the demo can start it as a separate process without a build step.
const loopDriverCommand = "loopdriver"

func runLoopDriver(args []string) int { return driver.Main(args) }

// demoDriver is the CSI driver the demo uses and how to stop it.
type demoDriver struct {
	name, endpoint string
	mounter        mount.Interface
	real           bool
	stop           func()
	kill           func()          // SIGKILL, for crash tests; nil in-process
	exited         <-chan struct{} // closed when the driver process has exited; nil in-process
}

// runDemo runs the whole job on an embedded default: an in-memory API
// server, a CSI driver, pods with a volume of every kind created,
// mounted, written to, read back, deleted and unmounted, their
// directories removed, and then a check that nothing is left: no mount,
// loop device or pod directory.
func runDemo(ctx context.Context, o options) (err error) {
	start := time.Now()
	root := o.rootDir
	if root == "" {
		dir, err := csitest.ShortTempDir("nodevol-demo-")
		if err != nil {
			return err
		}
		defer removeRoot(dir)
		root = dir
	}
	hostDir, err := os.MkdirTemp("", "nodevol-demo-host-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(hostDir)
	drv, err := startDemoDriver(ctx, root, o.node)
	if err != nil {
		return err
	}
	defer drv.stop()

	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{
		PodInfoOnMount: true,
		LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
	}), demoNode(o.node))
	if err := demoObjects(ctx, client); err != nil {
		return err
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: o.node, KubeClient: client, RootDir: root, Mounter: drv.mounter, PluginRegistration: true})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	defer func() { cancel(); <-ran }()
	vm.MarkPodsSynced() // the demo's pods are all added below: nothing older is wanted

	registrar, err := register(ctx, vm, root, drv)
	if err != nil {
		return err
	}
	defer registrar.stop()

	claims, err := provision(ctx, client, drv, o.pods, o.node)
	if err != nil {
		return err
	}
	var pods []*v1.Pod
	defer func() {
		if err != nil {
			// Whatever failed, the pods added go again, before the manager and
			// the driver stop: nothing is left mounted.
			drain(ctx, vm, pods)
		}
	}()
	for i, c := range claims {
		pod := demoPod(c.Name, o.node, c.Spec.Volumes[0].PersistentVolumeClaim.ClaimName, drv.name, filepath.Join(hostDir, c.Name))
		pods = append(pods, pod)
		if err := mountPod(ctx, vm, drv, pod, i, len(claims)); err != nil {
			return err
		}
	}
	for i, pod := range pods {
		if err := deletePod(ctx, vm, pod, i, len(pods)); err != nil {
			return err
		}
	}
	if err := waitUnstaged(ctx, vm); err != nil {
		return err
	}
	if err := nothingLeft(drv, root); err != nil {
		return err
	}
	summary(pods, drv, time.Since(start))
	return nil
}

// summary prints the demo's one-line result.
func summary(pods []*v1.Pod, drv *demoDriver, took time.Duration) {
	kind := "real mounts (ext4 on loop devices, tmpfs)"
	if !drv.real {
		kind = "the in-process test driver and a fake mounter"
	}
	fmt.Printf("nodevol demo: %d pods with %d kinds of volume mounted, written, read back and unmounted with %s in %.1fs; "+
		"0 mounts, 0 loop devices, 0 pod directories left\n",
		len(pods), len(pods[0].Spec.Volumes)-1, kind, took.Seconds())
}

// register starts the driver's registrar and waits until the driver has
// announced itself through plugins_registry, as on a real node: its
// registrar's socket, nodevol's plugin manager, the CSI registration
// handler.
func register(ctx context.Context, vm *volumemanager.VolumeManager, root string, drv *demoDriver) (*process, error) {
	isRegistered := registered(vm, drv.name)
	registrar, err := startDemoRegistrar(ctx, root, drv)
	if err != nil {
		return nil, err
	}
	select {
	case <-isRegistered:
	case <-time.After(30 * time.Second):
		registrar.stop()
		return nil, fmt.Errorf("driver %s not registered through %s within 30s", drv.name, registrationDir(root))
	case <-ctx.Done():
		registrar.stop()
		return nil, ctx.Err()
	}
	step("driver %s (%s) registered through %s", drv.name, drv.endpoint, registrationDir(root))
	return registrar, nil
}

// mountPod mounts the i-th of n pods' volumes, writes and reads back
// their files, and says so (the first pod's volumes one by one).
func mountPod(ctx context.Context, vm *volumemanager.VolumeManager, drv *demoDriver, pod *v1.Pod, i, n int) error {
	lines, err := mountAllKinds(ctx, vm, pod, func(v podvol.MountedVolume) string { return describe(drv.mounter, v) })
	if err != nil {
		return err
	}
	step("[%d/%d] pod %s/%s: %d volumes mounted, files written and read back", i+1, n, pod.Namespace, pod.Name, len(lines))
	if i == 0 {
		for _, l := range lines {
			step("      %s", l)
		}
	}
	return nil
}

// deletePod deletes the i-th of n pods, waits until its volumes are
// unmounted and removes its directory.
func deletePod(ctx context.Context, vm *volumemanager.VolumeManager, pod *v1.Pod, i, n int) error {
	vm.DeletePod(pod)
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	err := vm.WaitForUnmount(waitCtx, pod)
	done()
	if err != nil {
		return err
	}
	// The pod is gone: its directory goes too, never across a mount.
	if err := vm.CleanupPodDir(ctx, pod.UID); err != nil {
		return err
	}
	step("[%d/%d] pod %s/%s deleted: volumes unmounted, pod directory removed", i+1, n, pod.Namespace, pod.Name)
	return nil
}

// drain deletes the pods and waits, a minute at most, until their volumes
// are unmounted and unstaged, after a failure; what is left is printed.
func drain(ctx context.Context, vm *volumemanager.VolumeManager, pods []*v1.Pod) {
	ctx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	for _, pod := range pods {
		vm.DeletePod(pod)
	}
	for _, pod := range pods {
		if err := vm.WaitForUnmount(ctx, pod); err != nil {
			fmt.Fprintln(os.Stderr, "nodevol demo: after the failure:", err)
		}
	}
	if err := vm.WaitForUnstaged(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "nodevol demo: after the failure:", err)
	}
}

// removeRoot removes the demo's temporary root, unless something is
// still mounted under it: then it is left, and said so, for its data may
// not be removed through a mount.
func removeRoot(root string) {
	left, err := mountsUnder(mount.New(""), root)
	if err == nil && len(left) == 0 {
		_ = os.RemoveAll(root)
		return
	}
	fmt.Fprintf(os.Stderr, "nodevol demo: %s left in place: mounts under it %v (%v)\n", root, left, err)
}

// nothingLeft checks that the demo left no mount under root, no loop
// device on a file under it, and no pod directory.
func nothingLeft(drv *demoDriver, root string) error {
	left, err := mountsUnder(drv.mounter, root)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts left behind under %s: %v", root, left)
	}
	if drv.real {
		loops, err := loopDevicesOn(root)
		if err != nil {
			return err
		}
		if len(loops) > 0 {
			return fmt.Errorf("loop devices left on files under %s: %v", root, loops)
		}
	}
	pods, err := os.ReadDir(filepath.Join(root, "pods"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(pods) > 0 {
		return fmt.Errorf("pod directories left under %s: %d", filepath.Join(root, "pods"), len(pods))
	}
	return nil
}

// loopDevicesOn lists the loop devices whose backing file is under root.
func loopDevicesOn(root string) ([]string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		back, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if b := strings.TrimSpace(string(back)); strings.HasPrefix(b, root+"/") {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+b)
		}
	}
	return out, nil
}

// describe says what a pod volume is: what is mounted at its path, as the
// mount table has it, or where it lives.
func describe(m mount.Interface, v podvol.MountedVolume) string {
	if v.Path == "" {
		return v.Plugin
	}
	if s := source(m, v.Path); s != "" {
		return v.Plugin + ": " + s + " at " + v.Path
	}
	return v.Plugin + ": directory " + v.Path
}

func step(format string, args ...any) {
	fmt.Printf("  %s\n", fmt.Sprintf(format, args...))
}

// startDemoDriver starts the loop driver as a separate process when root,
// and the test kit's in-process driver otherwise.
func startDemoDriver(ctx context.Context, root, node string) (*demoDriver, error) {
	if os.Geteuid() != 0 {
		fmt.Println("nodevol demo: not running as root, so no real mounts: using the test kit's in-process CSI driver and a fake mounter")
		dir := filepath.Join(root, "csitest")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
		srv, err := csitest.Start(dir, csitest.Options{NodeID: node, CreateTargetDirs: true})
		if err != nil {
			return nil, err
		}
		return &demoDriver{name: srv.DriverName(), endpoint: srv.Endpoint(), mounter: mount.NewFakeMounter(nil), stop: srv.Stop}, nil
	}
	fmt.Println("nodevol demo: running as root: the loop CSI driver as a separate process, real ext4 volumes on loop devices")
	sock := filepath.Join(root, "plugins", driver.DefaultDriverName, "csi.sock")
	p, err := startSelf(ctx, filepath.Join(root, "loopdriver.log"), sock, loopDriverCommand,
		"--endpoint", "unix://"+sock, "--nodeid", node,
		"--statedir", filepath.Join(root, "loopdriver"), "--drivername", driver.DefaultDriverName)
	if err != nil {
		return nil, fmt.Errorf("the loop driver: %w", err)
	}
	return &demoDriver{name: driver.DefaultDriverName, endpoint: sock, mounter: mount.New(""), real: true, stop: p.stop, kill: p.kill, exited: p.exited}, nil
}

// process is a child process of this binary and how to end it.
type process struct {
	stop   func()          // SIGTERM, then SIGKILL after 10s; waits for the exit
	kill   func()          // SIGKILL, as a crash; waits for the exit
	exited <-chan struct{} // closed when the process has exited, for whatever reason
}

// startSelf runs this binary again with args, its output appended to
// logPath, and waits until it has created the unix socket sock.
func startSelf(ctx context.Context, logPath, sock string, args ...string) (*process, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	// A socket left by an earlier, killed instance must not pass for this one.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", args[0], err)
	}
	exited := make(chan struct{})
	var waitErr error // set before exited is closed
	go func() { waitErr = cmd.Wait(); close(exited) }()
	var once sync.Once
	end := func(sig os.Signal, grace time.Duration) {
		once.Do(func() {
			_ = cmd.Process.Signal(sig)
			select {
			case <-exited:
			case <-time.After(grace):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	p := &process{
		stop:   func() { end(syscall.SIGTERM, 10*time.Second) },
		kill:   func() { end(syscall.SIGKILL, 10*time.Second) },
		exited: exited,
	}
	// Wait for the socket: the process needs a moment to listen.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return p, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("%s exited before listening (see %s): %v", args[0], logPath, waitErr)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not create %s within 20s (see %s)", args[0], sock, logPath)
		}
	}
}

// provision creates n volumes (CreateVolume on the loop driver, as an
// external-provisioner would), their bound PVs and PVCs, and n pods.
func provision(ctx context.Context, client *fake.Clientset, drv *demoDriver, n int, node string) ([]*v1.Pod, error) {
	var ctrl csi.ControllerClient
	if drv.real {
		conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ctrl = csi.NewControllerClient(conn)
	}
	var pods []*v1.Pod
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("demo-%d", i)
		handle := name
		if ctrl != nil {
			resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
				Name:          name,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{{
					AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
					AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
				}},
			})
			if err != nil {
				return nil, fmt.Errorf("creating volume %s: %w", name, err)
			}
			handle = resp.GetVolume().GetVolumeId()
		}
		pvc, pv := csitest.BoundClaim("demo", name, csitest.PVSpec{Driver: drv.name, Handle: handle, FSType: "ext4"})
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if _, err := client.CoreV1().PersistentVolumeClaims("demo").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		pods = append(pods, csitest.Pod("demo", "pod-"+name, csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
			{Name: "data", Claim: name},
		}}))
	}
	step("%d volumes provisioned, PVs and PVCs bound", n)
	return pods, nil
}

// mountAndUse mounts the pod's volume and writes and reads a file in it,
// as the pod's container would.
func mountAndUse(ctx context.Context, vm *volumemanager.VolumeManager, pod *v1.Pod) (string, error) {
	if err := vm.AddPod(pod); err != nil {
		return "", err
	}
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pod); err != nil {
		return "", err
	}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 1 {
		return "", fmt.Errorf("pod %s: %d volumes mounted, want 1", pod.Name, len(vols))
	}
	file := filepath.Join(vols[0].Path, "hello.txt")
	want := []byte("hello from " + pod.Name + "\n")
	if err := os.WriteFile(file, want, 0o644); err != nil {
		return "", fmt.Errorf("pod %s: writing into its volume: %w", pod.Name, err)
	}
	got, err := os.ReadFile(file)
	if err != nil || !bytes.Equal(got, want) {
		return "", fmt.Errorf("pod %s: reading back %s: %q, %v", pod.Name, file, got, err)
	}
	return vols[0].Path, nil
}

// source says what is mounted at path, as the mount table has it ("" if nothing).
func source(m mount.Interface, path string) string {
	mps, err := m.List()
	if err != nil {
		return ""
	}
	for _, mp := range mps {
		if mp.Path == path {
			return mp.Type + " on " + mp.Device
		}
	}
	return ""
}

// waitUnstaged waits, a minute at most, until the node holds no volume
// any more: every device unstaged (WaitForUnstaged).
func waitUnstaged(ctx context.Context, vm *volumemanager.VolumeManager) error {
	ctx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForUnstaged(ctx); err != nil {
		return err
	}
	step("all volumes unstaged")
	return nil
}

func mountsUnder(m mount.Interface, root string) ([]string, error) {
	mps, err := m.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, root+"/") {
			out = append(out, mp.Path)
		}
	}
	return out, nil
}
