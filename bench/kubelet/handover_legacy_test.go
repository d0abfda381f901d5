package kubeletbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestHandoverLegacyStaging is a node an older kubelet left with a volume
// staged in the layout it used before the staging path was named after
// the volume handle's hash: plugins/kubernetes.io/csi/pv/{pvName}/globalmount,
// published into two pods (made by hand here, with the loop driver, as the
// older kubelet did it). nodevol takes over with one of the pods wanted:
// it keeps the legacy staging and the wanted pod's mount as they are, with
// the data, and unpublishes the other pod.
//
// The current kubelet (v1.37.2, as v1.33 before it) knows only the hashed
// staging path: it would stage the volume a second time there, which the
// driver refuses (the volume is staged at the legacy path), and the pod's
// volume would never be set up.
// So, before such a node goes to the current kubelet, its pods on
// legacy-staged volumes are restarted under nodevol (docs/OPERATIONS.md):
// the volume is unstaged from the legacy path (its directory removed) and
// staged again at the hashed path, and the kubelet then takes over the new
// pod with its mounts unchanged and tears it down to nothing.
func TestHandoverLegacyStaging(t *testing.T) {
	e := newEnv(t)
	v := e.volume("legacy", e.drivers[0], false)
	keep, gone := e.pod("legacy-keep", v), e.pod("legacy-gone", v)
	legacy := filepath.Join(e.root, "plugins", "kubernetes.io", "csi", "pv", v.pvName())
	e.olderKubelet(t, v, filepath.Join(legacy, "globalmount"), keep, gone)
	e.writeData(t, []*hvPod{keep, gone})
	before := mountIDs(e.root)

	a := e.startAgent([]*hvPod{keep})
	a.expect(t, "SYNCED")
	a.expect(t, "READY 1")
	e.waitMounts(t, "nodevol unpublishes the pod no longer wanted", e.without(before, []*hvPod{gone}))
	e.checkData(t, []*hvPod{keep})

	// The pod is restarted: a new pod of the same claim.
	again := e.pod("legacy-again", v)
	a.send(t, "delete ns/"+keep.name)
	a.expect(t, "GONE ns/"+keep.name)
	data, err := json.Marshal(again.pod)
	if err != nil {
		t.Fatal(err)
	}
	a.send(t, "add "+string(data))
	a.expect(t, "MOUNTED ns/"+again.name)
	if _, err := os.Lstat(legacy); !os.IsNotExist(err) {
		t.Errorf("the legacy staging directory is left after the restart: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(e.target(again, v), keep.name+".txt")); err != nil || string(got) != string(dataOf(keep, v)) {
		t.Errorf("the restarted pod reads %q, %v; want what the first pod wrote", got, err)
	}
	e.writeData(t, []*hvPod{again})
	before = mountIDs(e.root)
	if _, ok := before[e.staging(v)]; !ok {
		t.Fatalf("the volume is not staged at the hashed path after the restart: %v", e.diffMounts(before, nil))
	}
	e.stopAgent()

	k := e.startKubelet([]*hvPod{again})
	k.mountPods(t, again)
	e.waitMounts(t, "the kubelet takes the restarted pod over", before)
	e.checkData(t, []*hvPod{again})
	k.deletePods(t, again)
	k.waitUnstaged(t)
	e.waitMounts(t, "the kubelet unstages every volume", map[string]string{})
	e.stopKubelet()
	// The pv directory of the older layout stays, empty, as the older
	// kubelet leaves it: its unstaging removed pv/{pvName} only.
	e.checkNothingLeft(t, []*hvPod{again}, []*hvPod{keep, gone}, filepath.Join("plugins", "kubernetes.io", "csi", "pv"))
}

// olderKubelet does what an older kubelet did for the pods of volume v:
// stage it at staging, publish it into each pod, each step with its
// vol_data.json.
func (e *hvEnv) olderKubelet(t *testing.T, v *hvVolume, staging string, pods ...*hvPod) {
	t.Helper()
	writeVolData := func(dir string, data map[string]string) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	writeVolData(filepath.Dir(staging), map[string]string{"specVolID": v.pvName(), "volumeHandle": v.handle, "driverName": v.driver.name})
	conn, err := grpc.NewClient("unix://"+v.driver.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csipb.NewNodeClient(conn)
	// The capability the kubelet sends for a ReadWriteOnce PV to a driver
	// with SINGLE_NODE_MULTI_WRITER, as the loop driver has.
	capability := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.handle, StagingTargetPath: staging, VolumeCapability: capability}); err != nil {
		t.Fatalf("the older kubelet's NodeStageVolume: %v", err)
	}
	sum := sha256.Sum256([]byte(v.handle + v.driver.name + hvNode))
	for _, p := range pods {
		target := e.target(p, v)
		writeVolData(filepath.Dir(target), map[string]string{"specVolID": v.pvName(), "volumeHandle": v.handle, "driverName": v.driver.name,
			"nodeName": hvNode, "attachmentID": "csi-" + hex.EncodeToString(sum[:]), "volumeLifecycleMode": "Persistent"})
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.handle, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability}); err != nil {
			t.Fatalf("the older kubelet's NodePublishVolume for pod %s: %v", p.name, err)
		}
	}
}
