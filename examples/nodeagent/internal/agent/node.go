package agent

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/nodevol/nodevol/volumemanager"
)

// updateNodeAttachMode sets the node's
// volumes.kubernetes.io/controller-managed-attach-detach annotation as the
// volume manager's attach mode says, as the kubelet does when it registers
// its Node: without it the attach/detach controller never attaches
// volumes to the node; with it in self-attach mode the controller would
// attach them too. An agent that creates its Node calls
// vm.SetNodeAttachMode on the object before it creates it; this one finds
// the Node made by whatever registered it, and a missing Node is logged.
func updateNodeAttachMode(ctx context.Context, client kubernetes.Interface, vm *volumemanager.VolumeManager, name string) error {
	nodes := client.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !vm.SetNodeAttachMode(node) {
			return nil
		}
		_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		logWarning("Node not found: its attach mode annotation is not set, and the attach/detach controller "+
			"attaches no volume to it until the agent restarts after the Node is registered", "node", name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("setting the attach mode annotation of node %s: %w", name, err)
	}
	return nil
}
