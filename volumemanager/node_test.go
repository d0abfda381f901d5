package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestNodeArrivesLater: a PV with node affinity waits while this node's
// Node object is not known (no error is final), and mounts as soon as the
// Node arrives through the default informer, without waiting for a
// resync.
func TestNodeArrivesLater(t *testing.T) {
	e := newEnv(t, envOptions{})
	pvc, pv := csitest.BoundClaim("ns", "vol", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-vol"})
	pv.Spec.NodeAffinity = affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, node)}})
	e.create(pvc, pv)
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	err := e.mount(pod, 300*time.Millisecond)
	if err == nil || errors.Is(err, ErrFinal) || !strings.Contains(err.Error(), "node affinity: this node's Node object is not known yet") {
		t.Fatalf("WaitForAttachAndMount before the Node exists = %v, want a wait naming the unknown Node", err)
	}
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), testNode(node, map[string]string{"kubernetes.io/hostname": node}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatalf("WaitForAttachAndMount after the Node arrived = %v", err)
	}
}

func testNode(name string, labels map[string]string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("4Gi")}}}
}

func affinity(terms ...v1.NodeSelectorTerm) *v1.VolumeNodeAffinity {
	return &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: terms}}
}

func expr(key string, op v1.NodeSelectorOperator, values ...string) v1.NodeSelectorRequirement {
	return v1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}
