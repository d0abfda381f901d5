package adapter

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager/volumehealth"

	"github.com/nodevol/nodevol/podvol"
	nvm "github.com/nodevol/nodevol/volumemanager"
)

var _ cache.PluginHandler = (*Manager)(nil)

// ValidatePlugin checks a CSI driver's registration (the kubelet's plugin
// manager calls it for the CSIPlugin type).
func (m *Manager) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return m.registration.ValidatePlugin(ctx, name, endpoint, versions)
}

// RegisterPlugin registers a CSI driver with nodevol and records it in the
// Node and CSINode objects, within timeout when one is given.
func (m *Manager) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	if timeout != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	return m.registration.RegisterPlugin(ctx, name, endpoint, versions)
}

// DeRegisterPlugin removes a CSI driver whose registration socket is
// gone. The kubelet's plugin manager does not retry, so an error (the
// CSINode could not be updated) is logged; the driver is out of nodevol's
// registry whatever it says.
func (m *Manager) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	if err := m.registration.DeRegisterPlugin(ctx, name, endpoint); err != nil {
		klog.FromContext(ctx).Error(err, "Deregistering a CSI driver", "driver", name, "endpoint", endpoint)
	}
}

// kubeletError gives the kubelet the error type it acts on: a pod whose
// volume waits on the node's attach limit is rejected by the kubelet
// when it gets a *volumemanager.VolumeAttachLimitExceededError. Every
// other error is nodevol's *WaitError, which names each volume and cause
// and unwraps to the context's error when the wait ran out of time (the
// kubelet then records no FailedMount event of its own).
func kubeletError(err error) error {
	var limit *nvm.VolumeAttachLimitExceededError
	if !errors.As(err, &limit) {
		return err
	}
	out := &volumemanager.VolumeAttachLimitExceededError{UnattachedVolumes: []string{limit.Volume}, OriginalError: err}
	var w *nvm.WaitError
	if errors.As(err, &w) {
		out.UnmountedVolumes = w.Volumes
	}
	return out
}

// healthUpdater hands nodevol's volume health probes to the kubelet's
// status manager.
type healthUpdater struct{ u volumehealth.StatusUpdater }

// SetPodVolumeHealth implements nvm.VolumeHealthUpdater.
func (h healthUpdater) SetPodVolumeHealth(ctx context.Context, pod podvol.PodRef, volumeName string, conditions []v1.VolumeHealthCondition) error {
	h.u.SetPodVolumeHealth(klog.FromContext(ctx), pod.UID, volumeName, conditions)
	return nil
}
