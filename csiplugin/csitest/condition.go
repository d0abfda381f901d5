package csitest

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
)

// volumeConditionCapability is VOLUME_CONDITION, the node capability of
// CSI 1.3 to 1.12 that CSI 1.13 (this module's spec) reserved.
const volumeConditionCapability csi.NodeServiceCapability_RPC_Type = 4

// VolumeCondition is a volume's condition, as NodeGetVolumeStats reports it
// with Options.VolumeCondition.
type VolumeCondition struct {
	// Abnormal is true when the volume is not healthy.
	Abnormal bool
	// Message says why, for people.
	Message string
}

// SetVolumeCondition sets the condition NodeGetVolumeStats reports for
// volumeID from now on (with Options.VolumeCondition).
func (s *Server) SetVolumeCondition(volumeID string, c VolumeCondition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conditions == nil {
		s.conditions = map[string]VolumeCondition{}
	}
	s.conditions[volumeID] = c
}

// appendVolumeCondition adds c to resp as a CSI 1.12 driver sends it:
// field 2, message VolumeCondition {bool abnormal = 1; string message = 2;}.
func appendVolumeCondition(resp *csi.NodeGetVolumeStatsResponse, c VolumeCondition) {
	var msg []byte
	if c.Abnormal {
		msg = protowire.AppendTag(msg, 1, protowire.VarintType)
		msg = protowire.AppendVarint(msg, 1)
	}
	if c.Message != "" {
		msg = protowire.AppendTag(msg, 2, protowire.BytesType)
		msg = protowire.AppendString(msg, c.Message)
	}
	raw := resp.ProtoReflect().GetUnknown()
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, msg)
	resp.ProtoReflect().SetUnknown(raw)
}
