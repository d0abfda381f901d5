package reconciler

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// testHost is a loop's host in the tests that drive the loop alone: Start
// as the test says (nil: nothing started), the rest does nothing.
type testHost struct {
	onStart func(a oe.Action, in Input)
}

func (h testHost) Start(a oe.Action, in Input) {
	if h.onStart != nil {
		h.onStart(a, in)
	}
}

func (testHost) AttachHeld(podvol.UniqueVolumeName) bool        { return false }
func (testHost) HoldPod(types.UID, *v1.Pod)                     {}
func (testHost) HoldAttachment(podvol.UniqueVolumeName, string) {}
func (testHost) Forgotten()                                     {}
func (testHost) Retake(string) bool                             { return false }
