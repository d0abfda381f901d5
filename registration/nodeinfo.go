package registration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csi"
)

// NodeIDAnnotation is the Node annotation holding a JSON map from CSI
// driver name to the driver's ID of the node, as the kubelet writes it.
const NodeIDAnnotation = "csi.volume.kubernetes.io/nodeid"

// nodeInfo records registered CSI drivers on the Node object (NodeID
// annotation, topology labels) and in the CSINode object named after the
// node, as the kubelet's node info manager does. Updates are serialized and
// retried on conflict.
type nodeInfo struct {
	client   kubernetes.Interface
	nodeName string
	mu       sync.Mutex
}

// install records driver with its NodeGetInfo answer: its node ID in the
// annotation (merged with other drivers' entries), its topology segments
// as Node labels (a label already set to another value is an error, and
// nothing is changed), and its CSINode entry (the CSINode is created, owned
// by the Node, if missing) with the migrated-plugins annotation.
func (n *nodeInfo) install(ctx context.Context, driver string, info csi.NodeInfo) error {
	if info.NodeID == "" {
		return fmt.Errorf("recording CSI driver %s on node %s: the driver reported an empty node ID", driver, n.nodeName)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	node, err := n.updateNode(ctx, func(node *corev1.Node) error {
		if err := setNodeID(node, driver, info.NodeID); err != nil {
			return err
		}
		return setTopologyLabels(node, driver, info.Topology)
	})
	if err != nil {
		return fmt.Errorf("recording CSI driver %s on node %s: %w", driver, n.nodeName, err)
	}
	entry := csiNodeDriver(driver, info)
	err = n.updateCSINode(ctx, node, func(cn *storagev1.CSINode) {
		cn.Spec.Drivers = slices.DeleteFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver })
		cn.Spec.Drivers = append(cn.Spec.Drivers, entry)
		migratedPluginsAnnotation(cn)
	})
	if err != nil {
		return fmt.Errorf("recording CSI driver %s in CSINode %s: %w", driver, n.nodeName, err)
	}
	klog.FromContext(ctx).V(2).Info("Recorded CSI driver on node", "driver", driver, "node", n.nodeName, "nodeID", info.NodeID)
	return nil
}

// uninstall removes driver from the annotation and the CSINode. Topology
// labels stay: other drivers may share them. A missing Node or CSINode is
// not an error.
func (n *nodeInfo) uninstall(ctx context.Context, driver string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, err := n.updateNode(ctx, func(node *corev1.Node) error { return removeNodeID(node, driver) })
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing CSI driver %s from node %s: %w", driver, n.nodeName, err)
	}
	err = n.updateCSINode(ctx, nil, func(cn *storagev1.CSINode) {
		cn.Spec.Drivers = slices.DeleteFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver })
	})
	if err != nil {
		return fmt.Errorf("removing CSI driver %s from CSINode %s: %w", driver, n.nodeName, err)
	}
	klog.FromContext(ctx).V(2).Info("Removed CSI driver from node", "driver", driver, "node", n.nodeName)
	return nil
}

// updateNode gets the Node, applies modify to a copy and updates the Node
// if it changed, retrying on conflict. It returns the Node as stored.
func (n *nodeInfo) updateNode(ctx context.Context, modify func(*corev1.Node) error) (*corev1.Node, error) {
	nodes := n.client.CoreV1().Nodes()
	var result *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, n.nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		updated := node.DeepCopy()
		if err := modify(updated); err != nil {
			return err
		}
		if equality.Semantic.DeepEqual(node.ObjectMeta, updated.ObjectMeta) {
			result = node
			return nil
		}
		result, err = nodes.Update(ctx, updated, metav1.UpdateOptions{})
		return err
	})
	return result, err
}

// updateCSINode applies modify to the CSINode and stores it if it changed,
// retrying on conflict. A missing CSINode is created from an empty one when
// node is set (with an owner reference to it), else left missing.
func (n *nodeInfo) updateCSINode(ctx context.Context, node *corev1.Node, modify func(*storagev1.CSINode)) error {
	csiNodes := n.client.StorageV1().CSINodes()
	retriable := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	return retry.OnError(retry.DefaultRetry, retriable, func() error {
		cn, err := csiNodes.Get(ctx, n.nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if node == nil {
				return nil
			}
			cn = newCSINode(node)
			modify(cn)
			_, err = csiNodes.Create(ctx, cn, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		updated := cn.DeepCopy()
		modify(updated)
		if equality.Semantic.DeepEqual(cn.Spec, updated.Spec) && maps.Equal(cn.Annotations, updated.Annotations) {
			return nil
		}
		_, err = csiNodes.Update(ctx, updated, metav1.UpdateOptions{})
		return err
	})
}

func newCSINode(node *corev1.Node) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: node.Name,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1",
				Kind:       "Node",
				Name:       node.Name,
				UID:        node.UID,
			}},
		},
	}
}

// csiNodeDriver is driver's CSINode entry.
func csiNodeDriver(driver string, info csi.NodeInfo) storagev1.CSINodeDriver {
	d := storagev1.CSINodeDriver{
		Name:         driver,
		NodeID:       info.NodeID,
		TopologyKeys: slices.Sorted(maps.Keys(info.Topology)),
	}
	if info.MaxVolumesPerNode > 0 {
		count := int32(min(info.MaxVolumesPerNode, math.MaxInt32))
		d.Allocatable = &storagev1.VolumeNodeResources{Count: &count}
	}
	return d
}

// nodeIDs parses the NodeIDAnnotation of node; a missing annotation is an
// empty map.
func nodeIDs(node *corev1.Node) (map[string]string, error) {
	ids := map[string]string{}
	raw, ok := node.Annotations[NodeIDAnnotation]
	if !ok || raw == "" {
		return ids, nil
	}
	if err := json.Unmarshal([]byte(raw), &ids); err != nil {
		return nil, fmt.Errorf("annotation %s of node %s is not a JSON map of strings: %w", NodeIDAnnotation, node.Name, err)
	}
	if ids == nil {
		ids = map[string]string{}
	}
	return ids, nil
}

func setNodeIDs(node *corev1.Node, ids map[string]string) error {
	if len(ids) == 0 {
		delete(node.Annotations, NodeIDAnnotation)
		return nil
	}
	data, err := json.Marshal(ids) // sorted keys: a stable value
	if err != nil {
		return err
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[NodeIDAnnotation] = string(data)
	return nil
}

func setNodeID(node *corev1.Node, driver, id string) error {
	ids, err := nodeIDs(node)
	if err != nil {
		return err
	}
	if ids[driver] == id {
		return nil
	}
	ids[driver] = id
	return setNodeIDs(node, ids)
}

func removeNodeID(node *corev1.Node, driver string) error {
	ids, err := nodeIDs(node)
	if err != nil {
		return err
	}
	if _, ok := ids[driver]; !ok {
		return nil
	}
	delete(ids, driver)
	return setNodeIDs(node, ids)
}

// setTopologyLabels adds driver's topology segments as labels of node. A
// label already set to another value is an error.
func setTopologyLabels(node *corev1.Node, driver string, topology map[string]string) error {
	for _, key := range slices.Sorted(maps.Keys(topology)) {
		value := topology[key]
		if old, ok := node.Labels[key]; ok && old != value {
			return fmt.Errorf("topology label %s=%q of CSI driver %s conflicts with the node's label %s=%q",
				key, value, driver, key, old)
		}
	}
	for key, value := range topology {
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		node.Labels[key] = value
	}
	return nil
}
