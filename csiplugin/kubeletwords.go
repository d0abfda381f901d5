package csiplugin

import (
	"fmt"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// kubeletWords returns err with the kubelet's words for it
// (volume.WithCause): prefix, then the kubelet's words for err itself (a
// CSI call's gRPC status), as the kubelet's CSI plugin wraps what its
// client returns ("kubernetes.io/csi: attacher.UnmountDevice failed: ").
// err's own text is unchanged.
func kubeletWords(prefix string, err error) error {
	_, cause := volume.EventCause(err)
	return volume.WithCause(err, prefix+cause)
}

// The kubelet's words for a Secret of a CSI call it could not read, before
// those of its getCredentialsFromSecret: each takes the Secret's namespace
// and name.
const (
	stageSecretWords        = "fetching NodeStageSecretRef %s/%s failed: "
	blockStageSecretWords   = "kubernetes.io/csi: failed to get NodeStageSecretRef %s/%s: "
	publishSecretWords      = "fetching NodePublishSecretRef %s/%s failed: "
	blockPublishSecretWords = "kubernetes.io/csi: blockMapper.publishVolumeForBlock failed to get NodePublishSecretRef %s/%s: "
	expandSecretWords       = "expander.NodeExpand failed to get NodeExpandSecretRef %s/%s: "
)

// secretCause is the kubelet's words for Secret ref that a CSI call needs
// and that could not be read (err): words (one of the *SecretWords) and
// its getCredentialsFromSecret's.
func secretCause(words string, ref *podvol.SecretRef, err error) string {
	return fmt.Sprintf(words, ref.Namespace, ref.Name) +
		fmt.Sprintf("kubernetes.io/csi: failed to find the secret %s in the namespace %s with error: %v", ref.Name, ref.Namespace, err)
}
