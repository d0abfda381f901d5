package driver

import (
	"context"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// descriptionParameter is the one mutable parameter (VolumeAttributesClass)
// the driver knows: a note kept with the volume, at most 256 characters,
// changeable at any time with ControllerModifyVolume.
const descriptionParameter = "description"

// checkMutableParameters refuses unknown mutable parameters and bad values.
func checkMutableParameters(field string, params map[string]string) error {
	for k, v := range params {
		if k != descriptionParameter {
			return invalid("%s: unknown mutable parameter %q (this driver knows %q)", field, k, descriptionParameter)
		}
		if !utf8.ValidString(v) || utf8.RuneCountInString(v) > 256 {
			return invalid("%s: %s must be valid UTF-8 of at most 256 characters", field, k)
		}
	}
	return nil
}

// ControllerModifyVolume changes a volume's mutable parameters.
func (d *server) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := checkMutableParameters("mutable_parameters", req.GetMutableParameters()); err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := d.store.get(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	for k, val := range req.GetMutableParameters() {
		v.MutableParameters[k] = val
	}
	if err := d.store.put(v); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).V(2).Info("Modified volume", "volumeID", id, "mutableParameters", req.GetMutableParameters())
	return &csi.ControllerModifyVolumeResponse{}, nil
}
