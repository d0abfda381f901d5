package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

// TestEventCause: what a pod's event says of a plugin's error: the
// kubelet's text that the plugin marked (Cause, Causef, WithCause, or an
// error that knows it: AttachLimitError), the outermost when there are
// several, whatever context wraps it; else the error's own text; and the
// kubelet's step a plugin named with AtStep. The marks change neither the
// error's text nor what errors.Is and errors.As see.
func TestEventCause(t *testing.T) {
	notFound := errors.New(`configmap "cm" not found`)
	tests := []struct {
		name      string
		err       error
		wantStep  string
		wantCause string
		wantText  string
	}{
		{"no mark", errors.New("setting up: boom"), "", "setting up: boom", "setting up: boom"},
		{"Cause inside context", fmt.Errorf("setting up configMap volume \"cm\": %w", Cause(notFound)), "", `configmap "cm" not found`,
			`setting up configMap volume "cm": configmap "cm" not found`},
		{"Causef wraps", fmt.Errorf("ctx: %w", Causef("invalid HostPath `%s`: %w", "/a/../b", fs.ErrInvalid)), "", "invalid HostPath `/a/../b`: invalid argument",
			"ctx: invalid HostPath `/a/../b`: invalid argument"},
		{"WithCause keeps the text", fmt.Errorf("ctx: %w", WithCause(errors.New("nodevol's detail"), "the kubelet's")), "", "the kubelet's", "ctx: nodevol's detail"},
		{"the outermost mark", WithCause(fmt.Errorf("a: %w", Cause(errors.New("inner"))), "outer"), "", "outer", "a: inner"},
		{"AttachLimitError", fmt.Errorf("ctx: %w", &AttachLimitError{Volume: "v", Node: "n", Driver: "d", VolumeAttachment: "va", Message: "too many"}), "", "too many",
			"ctx: attaching volume v to node n failed (VolumeAttachment va): the node has reached the attach limit of driver d (ResourceExhausted): too many"},
		{"AtStep, no cause", fmt.Errorf("ctx: %w", AtStep(StepMapBlockVolume, errors.New("losetup failed"))), StepMapBlockVolume, "ctx: losetup failed", "ctx: losetup failed"},
		{"AtStep and a cause", AtStep(StepUnmapBlockVolume, fmt.Errorf("ctx: %w", Cause(errors.New("busy")))), StepUnmapBlockVolume, "busy", "ctx: busy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, cause := EventCause(tt.err)
			if step != tt.wantStep || cause != tt.wantCause {
				t.Errorf("EventCause = %q, %q; want %q, %q", step, cause, tt.wantStep, tt.wantCause)
			}
			if got := tt.err.Error(); got != tt.wantText {
				t.Errorf("Error() = %q, want %q", got, tt.wantText)
			}
		})
	}
	inner := fmt.Errorf("%w: %w", fs.ErrNotExist, ErrInProgress)
	for _, err := range []error{Cause(inner), Causef("x: %w", inner), WithCause(inner, "k"), AtStep(StepRemoveMapPath, inner)} {
		if !errors.Is(err, fs.ErrNotExist) || !IsUncertain(err) {
			t.Errorf("%T: errors.Is does not see through it", err)
		}
	}
	if Cause(nil) != nil || WithCause(nil, "x") != nil || AtStep("x", nil) != nil {
		t.Error("a mark of nil is not nil")
	}
}
