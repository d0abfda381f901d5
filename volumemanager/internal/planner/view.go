package planner

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// View is everything the planner knows of one volume: what pods want, what
// is done, what runs, what waits and why. The loop builds it; Plan reads
// nothing else.
type View struct {
	Name podvol.UniqueVolumeName
	// Spec is what the pods want (the desired spec), or what is set up
	// (the actual spec) when no pod wants the volume.
	Spec podvol.VolumeSpec
	// Caps are what the volume's plugin does with a wanted volume (attach,
	// stage, republish, ownership, lifecycle modes): every step the plan
	// starts for it reads them. CapsErr, when not nil, says why they are
	// not known (its driver is not registered yet): a wanted volume then
	// waits, and is planned again when its driver registers. Neither is
	// read for an unwanted volume: its teardown follows what was done.
	Caps    volume.Capabilities
	CapsErr error
	// Desired are the pods that want the volume, sorted by UID.
	Desired []podvol.PodVolume
	// Actual is what is done; Known is false when nothing is.
	Actual state.ActualVolume
	Known  bool
	// Pods are what the loop knows of the pods in Actual.Pods that are
	// not resolved or whose mounts were found on disk at start (podHold);
	// the others are left out.
	Pods map[types.UID]PodFacts
	// PodsSynced: every pod added before MarkPodsSynced has been resolved
	// (as far as the API server answers); until then what was found on
	// disk at start is kept.
	PodsSynced bool
	// FoundDevice: the device was found on disk at start (deviceHold).
	FoundDevice bool
	// Unreadable, if not empty, is a pod volume directory found at start
	// under the volume's PV name whose record could not be read: it may
	// use the device (deviceHold).
	Unreadable string
	// Refs are the mounts under the pods directory that referenced the
	// staging path when they were last gathered (by an unstage that
	// refused), and the resync they were gathered in.
	Refs StagingRefs
	// Resync counts the resyncs so far: references gathered in an earlier
	// one may be gone, and are looked for again by an unstage.
	Resync int
	// InFlight are the operations running on the volume.
	InFlight map[oe.Key]oe.OpKind
	// Backoff is the retry state of the volume's failed keys.
	Backoff map[oe.Key]*oe.BackoffEntry
	// WorldChanged: the world changed for the volume since its backoff was
	// recorded (its VolumeAttachment changed, its driver registered, it
	// was reported in use, or an operation that started before such a
	// change failed after it).
	WorldChanged bool
	// AttachHeld: the attachment may be confirmed only once the volume is
	// reported in the Node's volumesInUse, and it is not yet.
	AttachHeld bool
	// SelfAttach: the node attaches volumes itself (creates their
	// VolumeAttachments) instead of waiting for the attach/detach
	// controller to.
	SelfAttach bool
	// Republish are pods whose Mounted volume is due to be published again
	// (a resync came): they are, when Caps.Republish.
	Republish map[types.UID]bool
	// Expansion are the facts a node expansion is decided from (expansion).
	Expansion ExpansionFacts
	// Now is the time backoff is compared with.
	Now time.Time
}

// StagingRefs are mounts that referenced a volume's staging path.
type StagingRefs struct {
	// Paths are the referencing mounts; none when nothing referenced it.
	Paths []string
	// Resync is View.Resync when they were gathered.
	Resync int
}

// Decision is what Plan returns for one volume.
type Decision struct {
	// Actions are the operations to start now.
	Actions []oe.Action
	// Adopt are pod mounts found on disk (known by their pod's UID only)
	// that the desired pods of the same UID take as they are: the loop
	// records each as Mounted with the desired pod's volume before it
	// starts Actions.
	Adopt []podvol.PodVolume
	// ForgetBackoff are the keys whose backoff the loop forgets: the world
	// changed since they failed.
	ForgetBackoff []oe.Key
	// NodeSize, if > 0, is the size the loop records the node has the
	// volume at (Actual.Size was not known): the claim's status capacity,
	// taken at the first look for a node expansion.
	NodeSize int64
	// ForgetExpandHold: the loop forgets the held node expansion
	// (ExpansionFacts.Held): the claim has moved on.
	ForgetExpandHold bool
	// Expansion is the node expansion due, which Actions start (an
	// expansion, or a publish that expands) when they can; nil when none
	// is due.
	Expansion *Expansion
	// Waiting says why something that is due does not start (empty when
	// nothing waits): for logs, scripts and wait errors.
	Waiting []string
	// Retry is the earliest time a backoff that holds an action back
	// ends; zero when none does.
	Retry time.Time
	// Done is true when nothing of the volume is left and nothing runs:
	// the loop forgets it.
	Done bool
	// Refused are desired pods that may not use the volume now: a
	// lifecycle mode the driver does not support (lifecycleRefusals), an
	// SELinux conflict (admitSELinux) or ReadWriteOncePod (rwopRefusals).
	Refused []Refusal
	// NotReady, when not nil, is why every desired pod waits for the
	// volume: its capabilities are not known (View.CapsErr). The loop makes
	// it the pods' error, as an operation's failure wrapping
	// volume.ErrNotReady: no event, retried when the driver registers.
	NotReady error
}

// Refusal is a desired pod that may not use its volume now, and why.
type Refusal struct {
	Pod podvol.PodVolume
	Err error
}

func (d *Decision) wait(format string, args ...any) {
	d.Waiting = append(d.Waiting, fmt.Sprintf(format, args...))
}

// PodFacts are what the loop knows of a pod that has the volume (in
// View.Actual.Pods) and may hold its mount.
type PodFacts struct {
	// Unresolved, if not empty, says why the pod, added, cannot be
	// resolved (yet): it may still want the volume.
	Unresolved string
	// Added: the pod was added and not deleted since.
	Added bool
	// Found: its mount of the volume was found on disk at start.
	Found bool
}

// ExpansionFacts are what a node expansion of the volume is decided from.
type ExpansionFacts struct {
	// Expands: the volume is a PV and the node can expand volumes; a node
	// expansion is looked for once the volume is set up. False: none is.
	Expands bool
	// PV is the volume's PV and PVC the claim bound to it, as the listers
	// have them (read only); both nil when either is missing, the claim
	// is bound to another volume or the PV's source is not expanded on
	// the node.
	PV  *v1.PersistentVolume
	PVC *v1.PersistentVolumeClaim
	// Held is the node expansion that ended without growing the volume and
	// is not to be asked again as it was (oe.ExpandResult.Held); zero when
	// none is.
	Held ExpandHold
}

// ExpandHold is a node expansion that ended without growing the volume:
// not asked again at Size while the claim is at ClaimRV ("": at any
// version, until the volume is set up again).
type ExpandHold struct {
	Size    int64
	ClaimRV string
}

// holds reports whether the expansion to size, planned with the claim at
// claimRV, is the one held.
func (h ExpandHold) holds(size int64, claimRV string) bool {
	return h.Size > 0 && h.Size == size && (h.ClaimRV == "" || h.ClaimRV == claimRV)
}

// Expansion is a claim's node expansion due on this node.
type Expansion struct {
	// Size is the size to grow the volume to (ExpansionTarget: the
	// claim's allocated size, or the PV's capacity); From the size this
	// node has it at.
	Size, From int64
	// ClaimRV is the resourceVersion of the claim it was planned with.
	ClaimRV   string
	Namespace string
	Claim     string
	PV        string
}
