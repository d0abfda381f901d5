package csi

import (
	"context"
	"errors"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// maxHealthConditions is the most conditions the API takes in a pod's
// status.volumeHealth entry or a CSINode's status.storageHealth entry. An
// answer with more is refused whole, as the kubelet refuses one of
// NodeGetStorageHealth: the API server would refuse the status update.
const maxHealthConditions = 16

// VolumeHealthRequest is what NodeGetVolumeHealth is asked about.
type VolumeHealthRequest struct {
	// VolumeID is the volume's CSI ID. Required.
	VolumeID string
	// StagingPath is where the volume is (or was to be) staged; "" when
	// it never was or the driver does not stage.
	StagingPath string
	// PublishPath is where the volume is (or was to be) published for the
	// pod; "" when it never was.
	PublishPath string
}

// NodeGetVolumeHealth asks the driver for the adverse conditions of a
// volume on this node: none (an empty slice) means healthy. It needs the
// VolumeHealth capability. Conditions of a type the API does not know
// are left out, as the CSI spec asks of a CO; two with the same status
// and reason (the key of the API's list) are kept once; more than
// maxHealthConditions are an error.
func (c *Client) NodeGetVolumeHealth(ctx context.Context, req VolumeHealthRequest) ([]v1.VolumeHealthCondition, error) {
	if !c.caps.VolumeHealth {
		return nil, fmt.Errorf("CSI driver %s does not support NodeGetVolumeHealth", c.driver)
	}
	if req.VolumeID == "" {
		return nil, fmt.Errorf("NodeGetVolumeHealth of CSI driver %s: no volume ID", c.driver)
	}
	resp, err := call(ctx, c, "NodeGetVolumeHealth", &csipb.NodeGetVolumeHealthRequest{
		VolumeId:          req.VolumeID,
		StagingTargetPath: req.StagingPath,
		VolumePublishPath: req.PublishPath,
	}, c.node.NodeGetVolumeHealth)
	if err != nil {
		return nil, err
	}
	conds, err := volumeHealthConditions(resp.GetVolumeHealth().GetHealthStatuses())
	if err != nil {
		return nil, fmt.Errorf("NodeGetVolumeHealth of CSI driver %s for volume %s: %w", c.driver, req.VolumeID, err)
	}
	return conds, nil
}

// NodeGetStorageHealth asks the driver for the adverse conditions of its
// storage as seen from this node: none means healthy. It needs the
// StorageHealth capability. No secrets are sent (the kubelet sends none).
// Conditions of an unknown type are left out; a condition whose volume
// capability lacks an access type or mode, or has one the API cannot
// name, or more than maxHealthConditions conditions, make the answer an
// error, as in the kubelet.
func (c *Client) NodeGetStorageHealth(ctx context.Context) ([]storagev1.StorageHealthCondition, error) {
	if !c.caps.StorageHealth {
		return nil, fmt.Errorf("CSI driver %s does not support NodeGetStorageHealth", c.driver)
	}
	resp, err := call(ctx, c, "NodeGetStorageHealth", &csipb.NodeGetStorageHealthRequest{}, c.node.NodeGetStorageHealth)
	if err != nil {
		return nil, err
	}
	conds, err := storageHealthConditions(resp.GetBackendHealth())
	if err != nil {
		return nil, fmt.Errorf("NodeGetStorageHealth of CSI driver %s: %w", c.driver, err)
	}
	return conds, nil
}

// volumeHealthConditions maps a driver's volume health entries to the
// API's conditions.
func volumeHealthConditions(entries []*csipb.VolumeHealth_VolumeHealthEntry) ([]v1.VolumeHealthCondition, error) {
	if len(entries) > maxHealthConditions {
		return nil, fmt.Errorf("%d conditions, at most %d are allowed", len(entries), maxHealthConditions)
	}
	var out []v1.VolumeHealthCondition
	type key struct {
		status v1.VolumeHealthStatusType
		reason string
	}
	seen := map[key]bool{}
	for _, e := range entries {
		var status v1.VolumeHealthStatusType
		switch e.GetStatus() {
		case csipb.VolumeHealthErrorType_DEGRADED:
			status = v1.VolumeHealthDegraded
		case csipb.VolumeHealthErrorType_INACCESSIBLE:
			status = v1.VolumeHealthInaccessible
		case csipb.VolumeHealthErrorType_DATA_LOSS:
			status = v1.VolumeHealthDataLoss
		default:
			continue // newer than this CO, or unset
		}
		k := key{status, e.GetReason()}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, v1.VolumeHealthCondition{Status: status, Reason: e.GetReason(), Message: e.GetMessage()})
	}
	return out, nil
}

// storageHealthConditions maps a driver's storage health entries to the
// API's conditions.
func storageHealthConditions(entries []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth) ([]storagev1.StorageHealthCondition, error) {
	if len(entries) > maxHealthConditions {
		return nil, fmt.Errorf("%d conditions, at most %d are allowed", len(entries), maxHealthConditions)
	}
	var out []storagev1.StorageHealthCondition
	for i, e := range entries {
		var status storagev1.StorageHealthStatusType
		switch e.GetStatus() {
		case csipb.StorageHealthErrorType_STORAGE_DEGRADED:
			status = storagev1.StorageDegraded
		case csipb.StorageHealthErrorType_STORAGE_UNREACHABLE:
			status = storagev1.StorageUnreachable
		default:
			continue
		}
		cond := storagev1.StorageHealthCondition{Status: status, Reason: e.GetReason(), Message: e.GetMessage()}
		if vc := e.GetVolumeCapability(); vc != nil {
			access, mode, err := storageHealthCapability(vc)
			if err != nil {
				return nil, fmt.Errorf("condition %d (%s %s): volume capability: %w", i, status, e.GetReason(), err)
			}
			cond.AccessMode, cond.VolumeMode = &access, &mode
		}
		out = append(out, cond)
	}
	return out, nil
}

// storageHealthCapability names the PV access mode and volume mode a
// storage health condition's volume capability stands for.
func storageHealthCapability(vc *csipb.VolumeCapability) (v1.PersistentVolumeAccessMode, v1.PersistentVolumeMode, error) {
	var mode v1.PersistentVolumeMode
	switch {
	case vc.GetBlock() != nil:
		mode = v1.PersistentVolumeBlock
	case vc.GetMount() != nil:
		mode = v1.PersistentVolumeFilesystem
	default:
		return "", "", errors.New("no access type")
	}
	if vc.GetAccessMode() == nil {
		return "", "", errors.New("no access mode")
	}
	switch m := vc.GetAccessMode().GetMode(); m {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return v1.ReadWriteOnce, mode, nil
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER:
		return v1.ReadWriteOncePod, mode, nil
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return v1.ReadOnlyMany, mode, nil
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return v1.ReadWriteMany, mode, nil
	default:
		return "", "", fmt.Errorf("access mode %s has no PV access mode", m)
	}
}
