package csi

import (
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/nodevol/nodevol/volume"
)

// The volume condition of CSI 1.3 to 1.12 (alpha), which CSI 1.13 removed
// in favour of NodeGetVolumeHealth, leaving the numbers reserved. Drivers
// built on those versions (and the kubelet, with CSIVolumeHealth) still
// speak it, so nodevol reads it from the wire: the node capability
// VOLUME_CONDITION, and field 2 of NodeGetVolumeStatsResponse, a message
// VolumeCondition {bool abnormal = 1; string message = 2;}.
const (
	// volumeConditionCapability is the node capability VOLUME_CONDITION.
	volumeConditionCapability csipb.NodeServiceCapability_RPC_Type = 4
	// statsConditionField is NodeGetVolumeStatsResponse.volume_condition.
	statsConditionField protowire.Number = 2
)

// volumeConditionOf returns the volume condition in resp, nil when it has
// none (or a malformed one). Only a driver with the VolumeCondition
// capability sends one.
func volumeConditionOf(resp *csipb.NodeGetVolumeStatsResponse) *volume.Condition {
	var cond *volume.Condition
	for b := resp.ProtoReflect().GetUnknown(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == statsConditionField && typ == protowire.BytesType {
			msg, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil
			}
			cond = parseCondition(msg)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil
		}
		b = b[m:]
	}
	return cond
}

func parseCondition(b []byte) *volume.Condition {
	c := &volume.Condition{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil
			}
			c.Abnormal, b = v != 0, b[m:]
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeString(b)
			if m < 0 {
				return nil
			}
			c.Message, b = v, b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil
			}
			b = b[m:]
		}
	}
	return c
}
