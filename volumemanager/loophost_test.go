package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// testHost is a loop's host in the scenario scripts: Start and
// AttachHeld as the test says (nil: nothing started, nothing held),
// the rest does nothing.
type testHost struct {
	onStart func(a oe.Action, in reconciler.Input)
	held    func(name podvol.UniqueVolumeName) bool
}

func (h testHost) Start(a oe.Action, in reconciler.Input) {
	if h.onStart != nil {
		h.onStart(a, in)
	}
}

func (h testHost) AttachHeld(name podvol.UniqueVolumeName) bool {
	return h.held != nil && h.held(name)
}

func (testHost) HoldPod(types.UID, *v1.Pod)                     {}
func (testHost) HoldAttachment(podvol.UniqueVolumeName, string) {}
func (testHost) Forgotten()                                     {}
func (testHost) Retake(string) bool                             { return false }
