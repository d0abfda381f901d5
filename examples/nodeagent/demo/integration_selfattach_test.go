package main

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/testenv"
)

// selfAttachRBACFile adds what --self-attach needs to rbacFile, as shipped.
const selfAttachRBACFile = "../../../deploy/rbac-self-attach.yaml"

// TestIntegrationNodeAgentSelfAttach runs the nodeagent command with
// --self-attach against a real API server, as a user bound only to
// deploy/rbac.yaml and deploy/rbac-self-attach.yaml, the driver's CSIDriver
// requiring attach and an external attacher (the test kit's) attaching what
// the node creates:
//
//   - the pod mounts on a real loop device once the node has created its
//     volume's VolumeAttachment (the name the attach-detach controller would
//     give it, for this node and PV) and the attacher has attached it;
//   - the pod deleted, the volume is unmounted and unstaged and the node
//     deletes the VolumeAttachment; the node is exactly clean;
//   - no request of the agent was forbidden: the two files are exactly
//     the rights self-attach needs.
func TestIntegrationNodeAgentSelfAttach(t *testing.T) {
	roottest.Require(t)
	api := testenv.StartT(t, testenv.Options{Users: []testenv.User{{Name: agentUser, Groups: []string{agentGroup}}}})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(api.Config())
	e := newHoldEnv(t, ctx, "nv-isa-", 1)

	applyRBAC(t, ctx, admin, rbacFile)
	applyRBAC(t, ctx, admin, selfAttachRBACFile)
	mustCreate(t, "namespace", func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, "node", func() error {
		_, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}}, metav1.CreateOptions{})
		return err
	})
	for i := range e.objs.CSIDrivers {
		attach := true
		e.objs.CSIDrivers[i].Spec.AttachRequired = &attach
	}
	createVolumeObjects(t, ctx, admin, e)
	kubeconfig := writeAgentKubeconfig(t, ctx, api, e.root+"/kubeconfig")

	attacherCtx, stopAttacher := context.WithCancel(ctx)
	attacherDone := make(chan struct{})
	go func() {
		defer close(attacherDone)
		_ = csitest.RunFakeAttacher(attacherCtx, admin, csitest.AttacherOptions{Driver: e.drv.name})
	}()
	defer func() { stopAttacher(); <-attacherDone }()

	agent := startRealAgent(t, e.root, kubeconfig, e.node, "--self-attach")
	registrar, err := startDemoRegistrar(ctx, e.root, e.drv)
	if err != nil {
		t.Fatal(err)
	}
	defer registrar.stop()
	eventually(t, ctx, "the driver recorded on the Node and CSINode", func() (bool, error) {
		return recordedThroughAPI(ctx, admin, e.node, e.drv.name)
	})

	v := e.vols[0]
	vaName := csiplugin.AttachmentName(v.handle, e.drv.name, e.node)
	createPodThroughAPI(t, ctx, admin, e, 0)
	if !waitInvariant(t, e, "the pod mounted", e.vols) {
		t.FailNow()
	}
	e.writeVolume(t, e.vols[0])
	va, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the VolumeAttachment the node should have created: %v", err)
	}
	if va.Spec.NodeName != e.node || va.Spec.Attacher != e.drv.name || va.Spec.Source.PersistentVolumeName == nil ||
		*va.Spec.Source.PersistentVolumeName != v.pv || !va.Status.Attached {
		t.Errorf("VolumeAttachment %s: spec %+v, attached %v; want node %s, attacher %s, PV %s, attached",
			vaName, va.Spec, va.Status.Attached, e.node, e.drv.name, v.pv)
	}

	pod := e.vols[0].pod
	if err := admin.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitInvariant(t, e, "the pod deleted", nil)
	eventually(t, ctx, "the node to delete VolumeAttachment "+vaName, func() (bool, error) {
		_, err := admin.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if agent.logContains(t, 0, "forbidden") {
		t.Errorf("the agent was refused something with deploy/rbac.yaml and rbac-self-attach.yaml's rights:\n%s", agent.grep(t, 0, "forbidden"))
	}
	if err := agent.stop(); err != nil {
		t.Errorf("agent: %v", err)
	}
}
