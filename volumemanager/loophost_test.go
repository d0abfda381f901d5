package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// testHost is a loop's host in the tests that drive the loop alone: start
// and attachHeld as the test says (nil: nothing started, nothing held),
// the rest does nothing.
type testHost struct {
	onStart func(a oe.Action, in opInput)
	held    func(name podvol.UniqueVolumeName) bool
}

func (h testHost) start(a oe.Action, in opInput) {
	if h.onStart != nil {
		h.onStart(a, in)
	}
}

func (h testHost) attachHeld(name podvol.UniqueVolumeName) bool {
	return h.held != nil && h.held(name)
}

func (testHost) holdPod(types.UID, *v1.Pod)                     {}
func (testHost) holdAttachment(podvol.UniqueVolumeName, string) {}
func (testHost) forgotten()                                     {}
func (testHost) retake(string) bool                             { return false }
