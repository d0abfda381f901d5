package kubeletbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubeletcache "k8s.io/kubernetes/pkg/kubelet/volumemanager/cache"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/volumemanager/metrics"
	"k8s.io/kubernetes/pkg/volume"

	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/internal/roottest"
)

// The hand-over tests run nodevol as the example node agent demo's agent-fake
// (a nodevol volume manager on a fake API server, driven over stdio) and
// the loop driver as that binary's loopdriver subcommand, so that each side
// runs as it would on a node: the kubelet's volume manager in this process,
// nodevol and the driver in their own, and a hand-over is a process stopped
// and another started on the same root.

func TestMain(m *testing.M) {
	// The kubelet's volume manager registers its metrics in Run, in a
	// sync.Once, while its reconciler, started just before, may already
	// count a reconstruction in them: a data race in the kubelet that the
	// race detector reports in the first test. Registered here first, once,
	// on empty caches of its own (TestSharesKubeletMetrics gathers them).
	plugins := &volume.VolumePluginMgr{}
	kubeletmetrics.Register(kubeletcache.NewActualStateOfWorld("", plugins), kubeletcache.NewDesiredStateOfWorld(plugins, nil), plugins)
	code := m.Run()
	nodeagentDemo.Remove()
	nodeagent.Remove()
	fleetLoopdriverCmd.Remove()
	fleetRegistrarCmd.Remove()
	os.Exit(code)
}

// nodeagentDemo is the example node agent's demo command
// (examples/nodeagent/demo: the production agent has no agent-fake or
// loopdriver), and nodeagent the production command, both from nodevol's
// module, each built once by the first test that needs it.
var (
	nodeagentDemo = kubelettest.Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/nodeagent/demo"}
	nodeagent     = kubelettest.Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/nodeagent"}
)

const (
	hvNode   = "node-1"
	volBytes = 64 << 20
)

// hvVolume is one provisioned volume: its claim is "ns/{name}", its PV
// "pv-{name}".
type hvVolume struct {
	name   string
	driver *hvDriver
	block  bool
	handle string
}

func (v *hvVolume) pvName() string { return "pv-" + v.name }

// hvPod is a pod using volumes, each under the pod volume name "v-{name}".
type hvPod struct {
	name string
	vols []*hvVolume
	pod  *v1.Pod
}

func (p *hvPod) uid() types.UID { return types.UID("uid-" + p.name) }

// target is where the kubelet and nodevol publish the pod's volume: the
// mount directory of a filesystem volume, the publish file of a block one.
func (e *hvEnv) target(p *hvPod, v *hvVolume) string {
	if v.block {
		return filepath.Join(e.root, "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", v.pvName(), string(p.uid()))
	}
	return filepath.Join(e.root, "pods", string(p.uid()), "volumes", "kubernetes.io~csi", v.pvName(), "mount")
}

// staging is the volume's staging path in the current layout.
func (e *hvEnv) staging(v *hvVolume) string {
	if v.block {
		return filepath.Join(e.root, "plugins", "kubernetes.io", "csi", "volumeDevices", "staging", v.pvName())
	}
	sum := sha256.Sum256([]byte(v.handle))
	return filepath.Join(e.root, "plugins", "kubernetes.io", "csi", v.driver.name, hex.EncodeToString(sum[:]), "globalmount")
}

// hvDriver is a loop driver process.
type hvDriver struct {
	name, sock string
	attach     bool
	stop       func()
}

// hvEnv is one test's node: a root directory, its loop drivers, its
// volumes and pods, and what runs on it.
type hvEnv struct {
	t       *testing.T
	root    string
	drivers []*hvDriver
	vols    []*hvVolume
	pods    []*hvPod
	agent   *agentProc
	kubelet *kubeletVM
	nodevol *nodevolVM
	// configMaps and secrets are the API server's.
	configMaps []*v1.ConfigMap
	secrets    []*v1.Secret
	// tokens answers both sides' TokenRequests.
	tokens *tokenIssuer
	// podInfo sets the CSIDrivers' podInfoOnMount, with which both sides
	// tell a driver the pod and whether a volume is inline ephemeral.
	podInfo bool
}

var driverRuns sync.Mutex
var driverSeq int

// newEnv makes the root and starts a loop driver without and one with
// attach required; cleanup undoes everything, even when the test fails.
func newEnv(t *testing.T) *hvEnv {
	t.Helper()
	roottest.Require(t)
	root, err := os.MkdirTemp("", "hv-")
	if err != nil {
		t.Fatal(err)
	}
	e := &hvEnv{t: t, root: root, tokens: &tokenIssuer{}}
	t.Cleanup(e.cleanup)
	driverRuns.Lock()
	driverSeq++
	seq := driverSeq
	driverRuns.Unlock()
	// Names of their own per test: the kubelet's CSI driver store is
	// global to this process.
	for _, attach := range []bool{false, true} {
		name := fmt.Sprintf("hv%d.loop.csi.nodevol.io", seq)
		if attach {
			name = fmt.Sprintf("hv%d-attach.loop.csi.nodevol.io", seq)
		}
		e.drivers = append(e.drivers, e.startDriver(name, attach))
	}
	return e
}

func (e *hvEnv) startDriver(name string, attach bool) *hvDriver {
	e.t.Helper()
	sock := filepath.Join(e.root, "plugins", name, "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		e.t.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(e.root, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		e.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(nodeagentDemo.Path(e.t), "loopdriver", "--endpoint", "unix://"+sock, "--nodeid", hvNode,
		"--statedir", filepath.Join(e.root, "state-"+name), "--drivername", name, "--call-log", filepath.Join(e.root, name+".calls"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	d := &hvDriver{name: name, sock: sock, attach: attach, stop: func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}}
	e.waitFor(fmt.Sprintf("the loop driver %s to listen on %s", name, sock), 20*time.Second, func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	})
	return d
}

// waitFor polls cond (a condition on the node, not on time) until it
// holds, or fails the test after timeout.
func (e *hvEnv) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// volume provisions a volume on the driver (CreateVolume, as an
// external-provisioner would).
func (e *hvEnv) volume(name string, drv *hvDriver, block bool) *hvVolume {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+drv.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	capability := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	if block {
		capability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := csipb.NewControllerClient(conn).CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: volBytes}, VolumeCapabilities: []*csipb.VolumeCapability{capability},
	})
	if err != nil {
		e.t.Fatalf("creating volume %s: %v", name, err)
	}
	v := &hvVolume{name: name, driver: drv, block: block, handle: resp.GetVolume().GetVolumeId()}
	e.vols = append(e.vols, v)
	return v
}

// pod makes a pod of the volumes.
func (e *hvEnv) pod(name string, vols ...*hvVolume) *hvPod {
	p := &hvPod{name: name, vols: vols}
	c := v1.Container{Name: "c", Image: "busybox"}
	var volumes []v1.Volume
	for _, v := range vols {
		volumes = append(volumes, v1.Volume{Name: "v-" + v.name, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: v.name}}})
		if v.block {
			c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: "v-" + v.name, DevicePath: "/dev/" + v.name})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "v-" + v.name, MountPath: "/" + v.name})
		}
	}
	p.pod = &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: p.uid()},
		Spec:       v1.PodSpec{NodeName: hvNode, Volumes: volumes, Containers: []v1.Container{c}},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
	e.pods = append(e.pods, p)
	return p
}

// hvObjects are the API server's: CSIDrivers as the API server defaults
// them, bound PVs and PVCs, a VolumeAttachment attached for each volume of
// a driver with attach required (what the attach/detach controller and
// the external-attacher would have done: csitest's fake attacher does the
// same for nodevol's own tests), and the node with them in its status.
type hvObjects struct {
	CSIDrivers             []storagev1.CSIDriver        `json:"csiDrivers,omitempty"`
	PersistentVolumes      []v1.PersistentVolume        `json:"persistentVolumes,omitempty"`
	PersistentVolumeClaims []v1.PersistentVolumeClaim   `json:"persistentVolumeClaims,omitempty"`
	Pods                   []v1.Pod                     `json:"pods,omitempty"`
	VolumeAttachments      []storagev1.VolumeAttachment `json:"volumeAttachments,omitempty"`
	ConfigMaps             []v1.ConfigMap               `json:"configMaps,omitempty"`
	Secrets                []v1.Secret                  `json:"secrets,omitempty"`
	node                   v1.Node
}

// apiObjects are the objects for a fake clientset: all but the pods, and
// the node.
func (o *hvObjects) apiObjects() []kruntime.Object {
	var objs []kruntime.Object
	objs = appendAll(objs, o.CSIDrivers)
	objs = appendAll(objs, o.PersistentVolumes)
	objs = appendAll(objs, o.PersistentVolumeClaims)
	objs = appendAll(objs, o.VolumeAttachments)
	objs = appendAll(objs, o.ConfigMaps)
	objs = appendAll(objs, o.Secrets)
	return append(objs, &o.node)
}

// podObjects are the pods for a fake clientset.
func podObjects(pods []v1.Pod) []kruntime.Object { return appendAll(nil, pods) }

// appendAll appends a pointer to each item of items to objs.
func appendAll[T any, PT interface {
	*T
	kruntime.Object
}](objs []kruntime.Object, items []T) []kruntime.Object {
	for i := range items {
		objs = append(objs, PT(&items[i]))
	}
	return objs
}

func (e *hvEnv) objects(pods []*hvPod) hvObjects {
	no, podInfo := false, e.podInfo
	policy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	o := hvObjects{node: v1.Node{ObjectMeta: metav1.ObjectMeta{Name: hvNode},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi")}}}}
	for _, cm := range e.configMaps {
		o.ConfigMaps = append(o.ConfigMaps, *cm)
	}
	for _, s := range e.secrets {
		o.Secrets = append(o.Secrets, *s)
	}
	for _, d := range e.drivers {
		o.CSIDrivers = append(o.CSIDrivers, storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Spec: storagev1.CSIDriverSpec{
			AttachRequired: &d.attach, PodInfoOnMount: &podInfo, RequiresRepublish: &no, StorageCapacity: &no, SELinuxMount: &no,
			FSGroupPolicy: &policy, VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
		}})
	}
	for _, v := range e.vols {
		mode := v1.PersistentVolumeFilesystem
		fsType := "ext4"
		if v.block {
			mode, fsType = v1.PersistentVolumeBlock, ""
		}
		capacity := v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(volBytes, resource.BinarySI)}
		rwo := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
		o.PersistentVolumes = append(o.PersistentVolumes, v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: v.pvName()},
			Spec: v1.PersistentVolumeSpec{
				Capacity: capacity, AccessModes: rwo, VolumeMode: &mode,
				PersistentVolumeSource:        v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: v.driver.name, VolumeHandle: v.handle, FSType: fsType}},
				ClaimRef:                      &v1.ObjectReference{Namespace: "ns", Name: v.name, UID: types.UID("uid-claim-" + v.name)},
				PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			},
			Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
		})
		o.PersistentVolumeClaims = append(o.PersistentVolumeClaims, v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v.name, UID: types.UID("uid-claim-" + v.name)},
			Spec:       v1.PersistentVolumeClaimSpec{VolumeName: v.pvName(), AccessModes: rwo, VolumeMode: &mode},
			Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, Capacity: capacity, AccessModes: rwo},
		})
		if v.driver.attach {
			sum := sha256.Sum256([]byte(v.handle + v.driver.name + hvNode))
			pv := v.pvName()
			o.VolumeAttachments = append(o.VolumeAttachments, storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: "csi-" + hex.EncodeToString(sum[:])},
				Spec: storagev1.VolumeAttachmentSpec{Attacher: v.driver.name, NodeName: hvNode,
					Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
				Status: storagev1.VolumeAttachmentStatus{Attached: true},
			})
			o.node.Status.VolumesAttached = append(o.node.Status.VolumesAttached, v1.AttachedVolume{
				Name: v1.UniqueVolumeName("kubernetes.io/csi/" + v.driver.name + "^" + v.handle)})
		}
	}
	for _, p := range pods {
		o.Pods = append(o.Pods, *p.pod)
	}
	return o
}

// mountIDs maps each mount point under root to its mount IDs, as
// /proc/self/mountinfo has them (comma separated when stacked).
func mountIDs(root string) map[string]string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		panic(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			if out[f[4]] != "" {
				out[f[4]] += ","
			}
			out[f[4]] += f[0]
		}
	}
	return out
}

// loopDevices lists the loop devices whose backing file is under root,
// as "device backing-file".
func loopDevices(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	var devs []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], root+"/") {
			devs = append(devs, f[0]+" "+f[1])
		}
	}
	return devs
}

// volumeDirs lists every file and directory the kubelet and nodevol make
// for volumes under root: pods/ and plugins/kubernetes.io/, relative to
// root, sorted.
func volumeDirs(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	mounts := mountIDs(root)
	for _, top := range []string{"pods", filepath.Join("plugins", "kubernetes.io")} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d os.DirEntry, err error) error {
			if os.IsNotExist(err) {
				return nil
			}
			if err != nil {
				return err
			}
			r, _ := filepath.Rel(root, p)
			out = append(out, r)
			if _, mounted := mounts[p]; d.IsDir() && mounted {
				return filepath.SkipDir // a volume's content is not the node's layout
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(out)
	return out
}

// cleanup undoes whatever a test left, even when it failed half way:
// nodevol and the kubelet stopped, every mount under the root unmounted
// (deepest first), the drivers stopped, their loop devices detached, the
// root removed.
func (e *hvEnv) cleanup() {
	t := e.t
	e.stopAgent()
	e.stopKubelet()
	e.stopNodevol()
	for range 3 {
		ids := mountIDs(e.root)
		if len(ids) == 0 {
			break
		}
		mps := slices.Collect(func(yield func(string) bool) {
			for p := range ids {
				if !yield(p) {
					return
				}
			}
		})
		t.Logf("cleanup: unmounting %v", mps)
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
	for _, d := range e.drivers {
		d.stop()
	}
	for _, dev := range loopDevices(t, e.root) {
		t.Logf("cleanup: detaching %s", dev)
		_ = exec.Command("losetup", "--detach", strings.Fields(dev)[0]).Run()
	}
	if t.Failed() {
		for _, name := range []string{"agent.log"} {
			if data, err := os.ReadFile(filepath.Join(e.root, name)); err == nil {
				s := string(data)
				t.Logf("%s (the end):\n%s", name, s[max(0, len(s)-6000):])
			}
		}
	}
	if ids := mountIDs(e.root); len(ids) > 0 {
		t.Errorf("cleanup: mounts still under %s, not removing it: %v", e.root, ids)
		return
	}
	if err := os.RemoveAll(e.root); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}
