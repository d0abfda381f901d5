package kubeletbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	loopdriver "github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/internal/kubelettest"
)

// -fleet.claims gives each fleet pod one more volume, a CSI claim: each
// node runs nodevol's loop driver (examples/loopdriver) and registrar
// (examples/registrar) as processes of their own, as a driver's DaemonSet
// pod would, the registrar announcing the driver through the node's
// {root}/plugins_registry. Each claim is provisioned statically before
// the pods start: a volume made on its node's driver (CreateVolume, as an
// external-provisioner would), a PV of it with node affinity to the node
// (the driver's topology key) and a claim, both created Bound by the
// benchmark as the PV controller would bind them (testenv runs no
// controller manager). The CSIDriver says attachRequired=false: no
// attach/detach controller runs, and the kubelet makes no
// VolumeAttachment request for it. A claim is pod i's of its node in every
// generation: the pods created again under churn mount the same claims,
// as they read the same configMaps and secrets.
var fleetClaims = flag.Bool("fleet.claims", false, "BenchmarkFleet: each pod also mounts a CSI claim of its own "+
	"(each node runs the loop driver and its registrar as processes; a loop device per mounted claim)")

const (
	// fleetDriverName is the loop driver's name on every node.
	fleetDriverName = loopdriver.DefaultDriverName
	// fleetClaimBytes is each claim's size: the loop driver's smallest
	// (ext4 with a journal), a sparse image file.
	fleetClaimBytes = 16 << 20
	// fleetClaimVolume is the claim's volume name in a pod.
	fleetClaimVolume = "data"
	// fleetDriverWait bounds the wait for every driver's socket and for
	// every CSINode to list the driver: startFleetNodes' bound for every
	// Node Ready (at load 90 a fork's boot took 72 s).
	fleetDriverWait = 5 * time.Minute
)

// fleetClaimResources are the requests about claims: the claims, their
// PVs, attachments and the CSIDriver (a subset of fleetVolResources).
var fleetClaimResources = []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments", "csidrivers"}

// The loop driver and the registrar, each built once per test binary
// (TestMain removes them).
var (
	fleetLoopdriverCmd = kubelettest.Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/loopdriver", Flags: []string{"-trimpath"}}
	fleetRegistrarCmd  = kubelettest.Command{Dir: filepath.Join("..", ".."), Pkg: "./examples/registrar", Flags: []string{"-trimpath"}}
)

// fleetDriver is one node's loop driver: its socket and state directory.
type fleetDriver struct {
	node, sock, state string
}

// fleetNodeRoot is node's kubelet root directory: kubelettest.New's
// {Dir}/root, with Dir as startFleetNodes sets it.
func fleetNodeRoot(c *objCluster, node string) string {
	return filepath.Join(c.scratch, "nodes", node, "root")
}

// startFleetDrivers starts on each node the loop driver and then the
// registrar, and waits until every node's CSINode lists the driver (the
// kubelet registered it). The processes stop when b ends, the registrar
// first; before the kubelets stop and the cluster's cleanup unmounts
// what is left, every loop device of a driver's state is detached (at its
// last close, if mounted), so that a failed run leaves none.
func startFleetDrivers(b *testing.B, c *objCluster, nodes []fleetNode) []fleetDriver {
	b.Helper()
	driverBin, registrarBin := fleetLoopdriverCmd.Path(b), fleetRegistrarCmd.Path(b)
	drivers := make([]fleetDriver, len(nodes))
	for i, n := range nodes {
		dir := filepath.Join(c.scratch, "nodes", n.name, "csi")
		drivers[i] = fleetDriver{node: n.name, sock: filepath.Join(fleetNodeRoot(c, n.name), "plugins", fleetDriverName, "csi.sock"),
			state: filepath.Join(dir, "state")}
		if err := os.MkdirAll(filepath.Dir(drivers[i].sock), 0o750); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if err := detachLoops(drivers); err != nil {
			b.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(b.Context(), fleetDriverWait)
	defer cancel()
	for _, d := range drivers {
		dir := filepath.Dir(d.state)
		p := kubelettest.StartProcess(b, dir, "loopdriver", []string{driverBin, "--endpoint", "unix://" + d.sock,
			"--nodeid", d.node, "--statedir", d.state})
		err := p.WaitFor(ctx, "the loop driver's socket "+d.sock, func() bool {
			fi, err := os.Stat(d.sock)
			return err == nil && fi.Mode()&os.ModeSocket != 0
		})
		if err != nil {
			b.Fatal(err)
		}
		kubelettest.StartProcess(b, dir, "registrar", []string{registrarBin, "--reg-path", filepath.Join(fleetNodeRoot(c, d.node), "plugins_registry"),
			"--driver-name", fleetDriverName, "--endpoint", d.sock})
	}
	for i, d := range drivers {
		err := nodes[i].proc.WaitFor(ctx, "node "+d.node+"'s CSINode to list "+fleetDriverName, func() bool {
			n, err := c.admin.StorageV1().CSINodes().Get(ctx, d.node, metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == fleetDriverName })
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return drivers
}

// fleetCSIDriver is the loop driver's CSIDriver: no attach (no
// attach/detach controller runs), no pod info, persistent volumes only
// (csitest's defaults).
func fleetCSIDriver() *storagev1.CSIDriver {
	return csitest.CSIDriver(fleetDriverName, csitest.CSIDriverSpec{})
}

// createFleetCSIDriver creates the CSIDriver, before the kubelets start
// (a cluster has it before a node registers the driver).
func createFleetCSIDriver(ctx context.Context, c *objCluster) error {
	if _, err := c.admin.StorageV1().CSIDrivers().Create(ctx, fleetCSIDriver(), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the CSIDriver: %w", err)
	}
	return nil
}

// fleetClaimPV is the PV of node's claim name of the driver's volume
// handle: bound to the claim of UID uid, accessible from node only (the
// driver's topology key, as a provisioner of it sets), retained.
func fleetClaimPV(node, name string, uid types.UID, handle string) *v1.PersistentVolume {
	size := *resource.NewQuantity(fleetClaimBytes, resource.BinarySI)
	fs := v1.PersistentVolumeFilesystem
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
		Spec: v1.PersistentVolumeSpec{
			Capacity: v1.ResourceList{v1.ResourceStorage: size}, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, VolumeMode: &fs,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: fleetDriverName, VolumeHandle: handle, FSType: "ext4"}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{
					Key: "topology." + fleetDriverName + "/node", Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: objNS, Name: name, UID: uid},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
		},
	}
}

// fleetClaim is claim name, asking for its PV pv-{name} (static
// provisioning: no storage class).
func fleetClaim(name string) *v1.PersistentVolumeClaim {
	size := *resource.NewQuantity(fleetClaimBytes, resource.BinarySI)
	fs, none := v1.PersistentVolumeFilesystem, ""
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: objNS},
		Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv-" + name, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			VolumeMode: &fs, StorageClassName: &none,
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: size}}},
	}
}

// createFleetClaims provisions pods claims on each node's driver and
// creates each claim and its PV Bound, as the PV controller would have
// bound them: the claim first (for its UID), then the PV with the claim's
// UID in its claimRef, then both statuses. Each node in a goroutine of
// its own.
func createFleetClaims(ctx context.Context, c *objCluster, drivers []fleetDriver, pods int) error {
	errs := make(chan error, len(drivers))
	for _, d := range drivers {
		go func() { errs <- createNodeClaims(ctx, c, d, pods) }()
	}
	var all []error
	for range drivers {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// createNodeClaims is createFleetClaims for one node's driver.
func createNodeClaims(ctx context.Context, c *objCluster, d fleetDriver, pods int) error {
	conn, err := grpc.NewClient("unix://"+d.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctl := csipb.NewControllerClient(conn)
	core := c.admin.CoreV1()
	for i := range pods {
		name := fleetObjName(d.node, i)
		resp, err := ctl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
			Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: fleetClaimBytes},
			VolumeCapabilities: []*csipb.VolumeCapability{{
				AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
				AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			}},
		})
		if err != nil {
			return fmt.Errorf("creating volume %s on node %s's driver: %w", name, d.node, err)
		}
		pvc, err := core.PersistentVolumeClaims(objNS).Create(ctx, fleetClaim(name), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating claim %s: %w", name, err)
		}
		pv, err := core.PersistentVolumes().Create(ctx, fleetClaimPV(d.node, name, pvc.UID, resp.GetVolume().GetVolumeId()), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PV pv-%s: %w", name, err)
		}
		pv.Status.Phase = v1.VolumeBound
		if _, err := core.PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("binding PV %s: %w", pv.Name, err)
		}
		pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pvc.Spec.AccessModes,
			Capacity: v1.ResourceList{v1.ResourceStorage: pvc.Spec.Resources.Requests[v1.ResourceStorage]}}
		if _, err := core.PersistentVolumeClaims(objNS).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("binding claim %s: %w", name, err)
		}
	}
	return nil
}

// withFleetClaim adds to pod i of node its claim (fleetObjName's name,
// the same in every generation), mounted at /data.
func withFleetClaim(pod *v1.Pod, node string, i int) *v1.Pod {
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: fleetClaimVolume, VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: fleetObjName(node, i)}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: fleetClaimVolume, MountPath: "/" + fleetClaimVolume})
	return pod
}

// driverLoops are the loop devices backed by a file of one of drivers'
// state directories (/sys/block/loop*/loop/backing_file).
func driverLoops(drivers []fleetDriver) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		backing := strings.TrimSpace(string(data))
		if slices.ContainsFunc(drivers, func(d fleetDriver) bool { return strings.HasPrefix(backing, d.state+"/") }) {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return devs
}

// detachLoops detaches every loop device of drivers' state: at once if
// nothing holds it, else at its last close (the kernel's autoclear), once
// the cluster's cleanup has unmounted it.
func detachLoops(drivers []fleetDriver) error {
	var errs []error
	for _, dev := range driverLoops(drivers) {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("detaching %s: %w: %s", dev, err, out))
		}
	}
	return errors.Join(errs...)
}

// waitClaimsUnstaged waits until no loop device of drivers' state is
// left: every claim unmounted from its pods and its node (the kubelet
// unstages a volume after its last pod is gone) and detached.
func waitClaimsUnstaged(ctx context.Context, drivers []fleetDriver, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		devs := driverLoops(drivers)
		if len(devs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d loop devices of the claims still attached, for example %s: %w", len(devs), devs[0], ctx.Err())
		case <-tick.C:
		}
	}
}

// The run's steps for claims, each nothing without -fleet.claims (the
// spec's claims).

// claimsBefore creates the CSIDriver, before the kubelets start.
func (r *fleetRun) claimsBefore(ctx context.Context) {
	if r.spec.claims {
		r.must(createFleetCSIDriver(ctx, r.c))
	}
}

// claimsBoot starts each node's driver and registrar and waits until
// each kubelet registered the driver: part of the boot phase.
func (r *fleetRun) claimsBoot() {
	if r.spec.claims {
		r.drivers = startFleetDrivers(r.b, r.c, r.nodes)
	}
}

// claimsProvision provisions every pod's claim, after the boot phase and
// before the start phase (the benchmark's requests, not the nodes').
func (r *fleetRun) claimsProvision(ctx context.Context) {
	if r.spec.claims {
		r.must(createFleetClaims(ctx, r.c, r.drivers, r.spec.pods))
	}
}

// claimsUnstaged waits, once every pod is gone, until every claim is
// unstaged and its loop device detached, so that the drivers stop on a
// clean node.
func (r *fleetRun) claimsUnstaged(ctx context.Context) {
	if r.spec.claims {
		r.must(waitClaimsUnstaged(ctx, r.drivers, fleetGoneWait))
	}
}
