package kubeletfork_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/testenv"
)

// The cluster of the end-to-end test: one node, the loop driver, the
// objects a pod's volumes read.
const (
	e2eNode   = "node-1"
	e2eNS     = "e2e"
	e2eDriver = "loop.csi.nodevol.io"
	e2eCM     = "app-config"
	e2eCMKey  = "value"
	e2eCMVal  = "v1"
	e2eSecret = "app-secret"
	e2eSecKey = "password"
	e2eSecVal = "s3cret"
	volBytes  = 64 << 20
)

// forkEnv is testenv's API server, the fork's files and fake runtime, the
// loop driver and the registrar, all under scratch.
type forkEnv struct {
	t       *testing.T
	admin   kubernetes.Interface
	nodeCfg *rest.Config
	scratch string
	kubelet *kubelettest.Kubelet
	// sock is the loop driver's socket, state its state directory, calls
	// its call log (one line per Node service RPC).
	sock, state, calls string
	// flexSrc is the directory the flexVolume driver bind-mounts into
	// the flex pods, flexFSType its file system's type; flexCalls is the
	// driver's call log.
	flexSrc, flexFSType, flexCalls string
}

// The test's commands, each built once per test binary: the fork from
// this module, the loop driver and the registrar from nodevol's; with
// -trimpath, as make kubelet-fork builds the fork, so that the two share
// the compiled packages.
var (
	forkCmd      = kubelettest.Command{Dir: ".", Pkg: "./cmd/kubelet", Flags: []string{"-trimpath"}}
	driverCmd    = kubelettest.Command{Dir: "..", Pkg: "./examples/loopdriver", Flags: []string{"-trimpath"}}
	registrarCmd = kubelettest.Command{Dir: "..", Pkg: "./examples/registrar", Flags: []string{"-trimpath"}}
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, c := range []*kubelettest.Command{&forkCmd, &driverCmd, &registrarCmd} {
		c.Remove()
	}
	os.Exit(code)
}

// startForkEnv starts the API server (Node authorizer, NodeRestriction,
// the ServiceAccount admission plugin on), creates the objects, and
// starts the loop driver; startFork starts the fork, startRegistrar the
// registrar. The fork runs on the container runtime at runtime (a CRI
// endpoint), or on the fake runtime if runtime is "".
func startForkEnv(t *testing.T, runtime string) (*forkEnv, string, string) {
	t.Helper()
	scratch, err := os.MkdirTemp("", "fork-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	e := &forkEnv{t: t, scratch: scratch, state: filepath.Join(scratch, "state"), calls: filepath.Join(scratch, "driver.calls")}
	t.Cleanup(e.cleanup)
	fork, driver, registrar := forkCmd.Path(t), driverCmd.Path(t), registrarCmd.Path(t)
	env := testenv.StartT(t, testenv.Options{
		AuthorizationModes:      []string{"Node", "RBAC"},
		EnableAdmissionPlugins:  []string{"NodeRestriction"},
		DisableAdmissionPlugins: []string{},
	})
	e.admin = kubernetes.NewForConfigOrDie(env.Config())
	if e.nodeCfg, err = env.NodeConfig(e2eNode); err != nil {
		t.Fatal(err)
	}
	e.createObjects(t.Context())
	flexDir := e.installFlexDriver()
	e.kubelet, err = kubelettest.New(t, kubelettest.Options{Bin: fork, Dir: scratch, Env: env, Node: e2eNode, NodeConfig: e.nodeCfg,
		// Its server open to the test (checkStats reads /stats/summary);
		// a pod's volume stats calculated every 5 s, not every minute.
		Args: []string{"--v", "2", "--volume-plugin-dir", flexDir, "--anonymous-auth=true", "--volume-stats-agg-period=5s"}, RuntimeEndpoint: runtime})
	if err != nil {
		t.Fatal(err)
	}
	e.sock = filepath.Join(e.kubelet.Root, "plugins", e2eDriver, "csi.sock")
	if err := os.MkdirAll(filepath.Dir(e.sock), 0o750); err != nil {
		t.Fatal(err)
	}
	kubelettest.StartProcess(t, scratch, "loopdriver", []string{driver, "--endpoint", "unix://" + e.sock,
		"--nodeid", e2eNode, "--statedir", e.state, "--call-log", e.calls})
	return e, registrar, e.sock
}

// startFork starts the fork and waits until its Node is Ready; it returns
// the process and how long that took.
func (e *forkEnv) startFork() (*kubelettest.Process, time.Duration) {
	e.t.Helper()
	start := time.Now()
	p := e.kubelet.Start(e.t, "kubelet")
	ctx, cancel := context.WithTimeout(e.t.Context(), 2*time.Minute)
	defer cancel()
	if err := e.kubelet.WaitNodeReady(ctx, p, e.admin); err != nil {
		e.t.Fatal(err)
	}
	return p, time.Since(start)
}

// createObjects creates what the pods need that a cluster's controllers
// would have made (testenv runs no controller manager): the namespace,
// its default service account and kube-root-ca.crt; and a configMap, a
// secret, the flexVolume's secret and the loop driver's CSIDriver (no attach: no attach/detach
// controller runs; persistent and ephemeral; pod info on mount).
func (e *forkEnv) createObjects(ctx context.Context) {
	yes, no := true, false
	ca := e.nodeCfg.CAData
	core := e.admin.CoreV1()
	for what, f := range map[string]func() error{
		"namespace": func() error {
			_, err := core.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			_, err = core.ServiceAccounts(e2eNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(ca)}}
			if _, err := core.ConfigMaps(e2eNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return err
			}
			cm = &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: e2eCM}, Data: map[string]string{e2eCMKey: e2eCMVal}}
			if _, err := core.ConfigMaps(e2eNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return err
			}
			s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: e2eSecret}, StringData: map[string]string{e2eSecKey: e2eSecVal}}
			if _, err := core.Secrets(e2eNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
				return err
			}
			// The flexVolume's: of its driver's type, as the kubelet requires.
			s = &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: e2eFlexSecret}, Type: e2eFlexDriver, StringData: map[string]string{e2eSecKey: e2eSecVal}}
			_, err = core.Secrets(e2eNS).Create(ctx, s, metav1.CreateOptions{})
			return err
		},
		"CSIDriver": func() error {
			d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: e2eDriver}, Spec: storagev1.CSIDriverSpec{
				AttachRequired: &no, PodInfoOnMount: &yes,
				VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
			}}
			_, err := e.admin.StorageV1().CSIDrivers().Create(ctx, d, metav1.CreateOptions{})
			return err
		},
	} {
		if err := f(); err != nil {
			e.t.Fatalf("creating the %s's objects: %v", what, err)
		}
	}
}

// boundClaim provisions a volume on the loop driver (CreateVolume, as the
// external-provisioner) and creates a claim bound to a PV of it, as the
// PV controller would have: the claim first (for its UID), then the PV
// with the claim's UID in its claimRef, then both statuses Bound.
func (e *forkEnv) boundClaim(ctx context.Context, name string) *v1.PersistentVolume {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csipb.NewControllerClient(conn).CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: volBytes},
		VolumeCapabilities: []*csipb.VolumeCapability{{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		e.t.Fatalf("creating volume %s on the loop driver: %v", name, err)
	}
	return e.bindClaim(ctx, name, *resource.NewQuantity(volBytes, resource.BinarySI), v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
		Driver: e2eDriver, VolumeHandle: resp.GetVolume().GetVolumeId(), FSType: "ext4"}}, nil)
}

// bindClaim creates a claim name and a PV pv-{name} of src bound to it, as
// the PV controller would bind them.
func (e *forkEnv) bindClaim(ctx context.Context, name string, size resource.Quantity, src v1.PersistentVolumeSource, affinity *v1.VolumeNodeAffinity) *v1.PersistentVolume {
	e.t.Helper()
	rwo, fs, empty := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, v1.PersistentVolumeFilesystem, ""
	pvc, err := e.admin.CoreV1().PersistentVolumeClaims(e2eNS).Create(ctx, &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv-" + name, AccessModes: rwo, VolumeMode: &fs, StorageClassName: &empty,
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: size}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv, err := e.admin.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
		Spec: v1.PersistentVolumeSpec{Capacity: v1.ResourceList{v1.ResourceStorage: size}, AccessModes: rwo, VolumeMode: &fs,
			PersistentVolumeSource:        src,
			NodeAffinity:                  affinity,
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: e2eNS, Name: name, UID: pvc.UID},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv.Status.Phase = v1.VolumeBound
	if pv, err = e.admin.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: rwo, Capacity: v1.ResourceList{v1.ResourceStorage: size}}
	if _, err := e.admin.CoreV1().PersistentVolumeClaims(e2eNS).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return pv
}

// accessName matches the name the ServiceAccount admission plugin gives
// the projected volume it adds.
var accessName = regexp.MustCompile(`kube-api-access-[a-z0-9]{5}`)

// globalName matches the hash in a CSI volume's staging path.
var globalName = regexp.MustCompile(`/[0-9a-f]{64}/globalmount$`)

// mountTable is every mount under the fork's root but the root's bind
// mount onto itself, as "path fstype" relative to the root, with pod UIDs
// replaced by names (uids maps UID to name), the projected volume's
// random suffix by "*" and the staging hash by "*"; sorted.
func (e *forkEnv) mountTable(uids map[string]string) []string {
	e.t.Helper()
	ms, err := realnode.MountsUnder(e.kubelet.Root)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		rel, err := filepath.Rel(e.kubelet.Root, m.Point)
		if err != nil || rel == "." {
			continue
		}
		for uid, name := range uids {
			rel = strings.Replace(rel, uid, name, 1)
		}
		rel = accessName.ReplaceAllString(rel, "kube-api-access-*")
		rel = globalName.ReplaceAllString(rel, "/*/globalmount")
		out = append(out, rel+" "+m.FSType)
	}
	sort.Strings(out)
	return out
}

// loopDevices are the loop devices backed by a file of the driver's state
// directory.
func (e *forkEnv) loopDevices() []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), e.state+"/") {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return devs
}

// cleanup unmounts what is left under scratch, detaches the loop devices
// left, and removes scratch.
func (e *forkEnv) cleanup() {
	if err := realnode.Unmount(e.scratch); err != nil {
		e.t.Errorf("not removing %s: %v", e.scratch, err)
		return
	}
	for _, dev := range e.loopDevices() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			e.t.Errorf("detaching %s: %v: %s", dev, err, out)
		}
	}
	if e.t.Failed() {
		e.t.Logf("kept %s for its logs", e.scratch)
		return
	}
	if err := os.RemoveAll(e.scratch); err != nil {
		e.t.Error(err)
	}
}

// waitFor polls cond every 50 ms until it holds or a minute passes.
func (e *forkEnv) waitFor(p *kubelettest.Process, what string, cond func() bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), time.Minute)
	defer cancel()
	if err := p.WaitFor(ctx, what, cond); err != nil {
		e.t.Fatal(fmt.Errorf("%w; mounts: %v", err, e.mountTable(nil)))
	}
}

// The flexVolume driver of the end-to-end test, and the type of secret it
// reads (a flexVolume's secret must be of its driver's type).
const (
	e2eFlexDriver = "nodevol.io/bind"
	e2eFlexSecret = "flex-secret"
	e2eFlexFile   = "hello"
	e2eFlexText   = "from the flexVolume's source"
)

// installFlexDriver writes the flexVolume driver, an sh script that
// bind-mounts its "source" option at the pod's directory with the real
// mount command, into a volume plugin directory of scratch, and the
// source with e2eFlexFile; it returns the directory. The driver logs each
// call's command and directory, and whether the JSON options carried the
// secret's key as the kubelet passes it (base64), never the value.
func (e *forkEnv) installFlexDriver() string {
	e.t.Helper()
	dir := filepath.Join(e.scratch, "volume-plugins")
	drvDir := filepath.Join(dir, strings.ReplaceAll(e2eFlexDriver, "/", "~"))
	e.flexSrc, e.flexCalls = filepath.Join(e.scratch, "flex-source"), filepath.Join(e.scratch, "flex.calls")
	for _, d := range []string{drvDir, e.flexSrc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.flexSrc, e2eFlexFile), []byte(e2eFlexText), 0o644); err != nil {
		e.t.Fatal(err)
	}
	secret := `"kubernetes.io/secret/` + e2eSecKey + `":"` + base64.StdEncoding.EncodeToString([]byte(e2eSecVal)) + `"`
	script := `#!/bin/sh
case "$3" in *'` + secret + `'*) s=secret;; *) s=nosecret;; esac
echo "$1 $2 $s" >> ` + e.flexCalls + `
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) src=$(printf '%s' "$3" | sed -n 's/.*"source":"\([^"]*\)".*/\1/p')
  if mount --bind "$src" "$2"; then echo '{"status":"Success"}'; else echo '{"status":"Failure","message":"bind mount failed"}'; fi;;
unmount) if umount "$2"; then echo '{"status":"Success"}'; else echo '{"status":"Failure","message":"umount failed"}'; fi;;
*) echo '{"status":"Not supported"}';;
esac
`
	if err := os.WriteFile(filepath.Join(drvDir, "bind"), []byte(script), 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.flexFSType = fsTypeOf(e.t, e.flexSrc)
	return dir
}

// fsTypeOf is the type of the file system path is on: that of the
// innermost mount at path or above it.
func fsTypeOf(t *testing.T, path string) string {
	t.Helper()
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		ms, err := realnode.MountsUnder(p)
		if err != nil {
			t.Fatal(err)
		}
		fsType := ""
		for _, m := range ms {
			if m.Point == p {
				fsType = m.FSType // the last one stacked there
			}
		}
		if fsType != "" {
			return fsType
		}
		if p == "/" {
			t.Fatalf("no mount above %s", path)
		}
	}
}
