package registration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/csi"
)

const nodeInfoTestNode = "node-1"

func nodeInfoTestSetup(t *testing.T, annotations, labels map[string]string, objs ...runtime.Object) (*nodeInfo, *fake.Clientset) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeInfoTestNode, UID: "node-uid", Annotations: annotations, Labels: labels,
	}}
	client := fake.NewClientset(append([]runtime.Object{node}, objs...)...)
	return &nodeInfo{client: client, nodeName: nodeInfoTestNode}, client
}

func getNode(t *testing.T, client *fake.Clientset) *corev1.Node {
	t.Helper()
	node, err := client.CoreV1().Nodes().Get(context.Background(), nodeInfoTestNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func getCSINode(t *testing.T, client *fake.Clientset) *storagev1.CSINode {
	t.Helper()
	cn, err := client.StorageV1().CSINodes().Get(context.Background(), nodeInfoTestNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cn
}

func annotationIDs(t *testing.T, node *corev1.Node) map[string]string {
	t.Helper()
	raw, ok := node.Annotations[NodeIDAnnotation]
	if !ok {
		return nil
	}
	ids := map[string]string{}
	if err := json.Unmarshal([]byte(raw), &ids); err != nil {
		t.Fatalf("annotation %q: %v", raw, err)
	}
	return ids
}

func driverEntry(cn *storagev1.CSINode, name string) *storagev1.CSINodeDriver {
	for i := range cn.Spec.Drivers {
		if cn.Spec.Drivers[i].Name == name {
			return &cn.Spec.Drivers[i]
		}
	}
	return nil
}

func TestNodeInfoInstallAndUninstall(t *testing.T) {
	ctx := context.Background()
	n, client := nodeInfoTestSetup(t, map[string]string{NodeIDAnnotation: `{"other.example.com":"other-id"}`, "keep": "me"},
		map[string]string{"zone": "z1"})
	info := csi.NodeInfo{NodeID: "id-1", MaxVolumesPerNode: 10, Topology: map[string]string{"zone": "z1", "rack": "r7"}}
	if err := n.install(ctx, "a.example.com", info); err != nil {
		t.Fatal(err)
	}
	node := getNode(t, client)
	if ids := annotationIDs(t, node); len(ids) != 2 || ids["a.example.com"] != "id-1" || ids["other.example.com"] != "other-id" {
		t.Errorf("annotation = %v, want both drivers", ids)
	}
	if node.Annotations["keep"] != "me" || node.Labels["zone"] != "z1" || node.Labels["rack"] != "r7" {
		t.Errorf("annotations %v labels %v", node.Annotations, node.Labels)
	}
	cn := getCSINode(t, client)
	if len(cn.OwnerReferences) != 1 || cn.OwnerReferences[0].Kind != "Node" || cn.OwnerReferences[0].UID != "node-uid" {
		t.Errorf("owner references = %+v", cn.OwnerReferences)
	}
	d := driverEntry(cn, "a.example.com")
	if d == nil || d.NodeID != "id-1" || strings.Join(d.TopologyKeys, ",") != "rack,zone" ||
		d.Allocatable == nil || d.Allocatable.Count == nil || *d.Allocatable.Count != 10 {
		t.Fatalf("CSINode drivers = %+v", cn.Spec.Drivers)
	}

	// A second driver, without limits, and the first one again with a new ID.
	if err := n.install(ctx, "b.example.com", csi.NodeInfo{NodeID: "id-b"}); err != nil {
		t.Fatal(err)
	}
	if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id-2"}); err != nil {
		t.Fatal(err)
	}
	cn = getCSINode(t, client)
	if len(cn.Spec.Drivers) != 2 {
		t.Fatalf("CSINode drivers = %+v, want a and b once each", cn.Spec.Drivers)
	}
	if d := driverEntry(cn, "a.example.com"); d.NodeID != "id-2" || d.Allocatable != nil || len(d.TopologyKeys) != 0 {
		t.Errorf("updated entry = %+v", d)
	}
	if d := driverEntry(cn, "b.example.com"); d == nil || d.Allocatable != nil {
		t.Errorf("entry b = %+v, want no allocatable", d)
	}

	if err := n.uninstall(ctx, "a.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := n.uninstall(ctx, "a.example.com"); err != nil {
		t.Fatalf("second uninstall: %v", err)
	}
	if ids := annotationIDs(t, getNode(t, client)); len(ids) != 2 || ids["a.example.com"] != "" {
		t.Errorf("annotation after uninstall = %v, want other and b", ids)
	}
	if cn := getCSINode(t, client); len(cn.Spec.Drivers) != 1 || cn.Spec.Drivers[0].Name != "b.example.com" {
		t.Errorf("CSINode after uninstall = %+v", cn.Spec.Drivers)
	}
	if getNode(t, client).Labels["rack"] != "r7" {
		t.Error("topology labels removed on uninstall; other drivers may use them")
	}
}

func TestNodeInfoUninstallLastDriverRemovesAnnotation(t *testing.T) {
	ctx := context.Background()
	n, client := nodeInfoTestSetup(t, nil, nil)
	if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id"}); err != nil {
		t.Fatal(err)
	}
	if err := n.uninstall(ctx, "a.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, ok := getNode(t, client).Annotations[NodeIDAnnotation]; ok {
		t.Error("empty annotation left behind")
	}
	if cn := getCSINode(t, client); len(cn.Spec.Drivers) != 0 {
		t.Errorf("CSINode drivers = %+v", cn.Spec.Drivers)
	}
}

func TestNodeInfoUpdatesExistingCSINode(t *testing.T) {
	existing := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: nodeInfoTestNode},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "other.example.com", NodeID: "o"}}},
	}
	n, client := nodeInfoTestSetup(t, nil, nil, existing)
	if err := n.install(context.Background(), "a.example.com", csi.NodeInfo{NodeID: "id"}); err != nil {
		t.Fatal(err)
	}
	if cn := getCSINode(t, client); len(cn.Spec.Drivers) != 2 {
		t.Errorf("CSINode drivers = %+v, want other and a", cn.Spec.Drivers)
	}
}

func TestNodeInfoTopologyConflict(t *testing.T) {
	n, client := nodeInfoTestSetup(t, nil, map[string]string{"zone": "z1"})
	err := n.install(context.Background(), "a.example.com", csi.NodeInfo{NodeID: "id", Topology: map[string]string{"zone": "z2"}})
	if err == nil || !strings.Contains(err.Error(), `zone="z2"`) || !strings.Contains(err.Error(), `zone="z1"`) {
		t.Fatalf("install = %v, want a topology conflict naming both values", err)
	}
	if ids := annotationIDs(t, getNode(t, client)); ids != nil {
		t.Errorf("annotation set despite the conflict: %v", ids)
	}
	if _, err := client.StorageV1().CSINodes().Get(context.Background(), nodeInfoTestNode, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSINode created despite the conflict: %v", err)
	}
}

// failFirst makes the first n calls of verb on resource fail with a
// Conflict (or err when set) and counts every call.
func failFirst(client *fake.Clientset, verb, resource string, n int, err error) *int {
	calls := 0
	client.PrependReactor(verb, resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		calls++
		if calls <= n {
			if err != nil {
				return true, nil, err
			}
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: resource}, nodeInfoTestNode, nil)
		}
		return false, nil, nil
	})
	return &calls
}

func TestNodeInfoRetriesConflicts(t *testing.T) {
	n, client := nodeInfoTestSetup(t, nil, nil)
	nodeUpdates := failFirst(client, "update", "nodes", 2, nil)
	csiNodeCreates := failFirst(client, "create", "csinodes", 1,
		apierrors.NewAlreadyExists(schema.GroupResource{Resource: "csinodes"}, nodeInfoTestNode))
	if err := n.install(context.Background(), "a.example.com", csi.NodeInfo{NodeID: "id"}); err != nil {
		t.Fatal(err)
	}
	if *nodeUpdates != 3 || *csiNodeCreates != 2 {
		t.Errorf("node updates %d (want 3), CSINode creates %d (want 2)", *nodeUpdates, *csiNodeCreates)
	}
	if ids := annotationIDs(t, getNode(t, client)); ids["a.example.com"] != "id" {
		t.Errorf("annotation = %v", ids)
	}

	csiNodeUpdates := failFirst(client, "update", "csinodes", 1, nil)
	if err := n.uninstall(context.Background(), "a.example.com"); err != nil {
		t.Fatal(err)
	}
	if *csiNodeUpdates != 2 {
		t.Errorf("CSINode updates = %d, want 2", *csiNodeUpdates)
	}
}

func TestNodeInfoGivesUpOnPersistentConflict(t *testing.T) {
	n, client := nodeInfoTestSetup(t, nil, nil)
	failFirst(client, "update", "nodes", 1000, nil)
	err := n.install(context.Background(), "a.example.com", csi.NodeInfo{NodeID: "id"})
	if !apierrors.IsConflict(err) {
		t.Errorf("install = %v, want a conflict", err)
	}
}

func TestNodeInfoErrors(t *testing.T) {
	ctx := context.Background()
	n, _ := nodeInfoTestSetup(t, map[string]string{NodeIDAnnotation: "{not json"}, nil)
	if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id"}); err == nil || !strings.Contains(err.Error(), NodeIDAnnotation) {
		t.Errorf("install with a malformed annotation = %v", err)
	}
	if err := n.install(ctx, "a.example.com", csi.NodeInfo{}); err == nil || !strings.Contains(err.Error(), "empty node ID") {
		t.Errorf("install with an empty node ID = %v", err)
	}
	missing := &nodeInfo{client: fake.NewClientset(), nodeName: "nowhere"}
	if err := missing.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id"}); !apierrors.IsNotFound(err) {
		t.Errorf("install without a Node = %v, want NotFound", err)
	}
	if err := missing.uninstall(ctx, "a.example.com"); err != nil {
		t.Errorf("uninstall without Node and CSINode = %v, want nil", err)
	}
}
