package resolve

import (
	"errors"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// Table is pod resolution as the loop consumes it: the pods added and
// not deleted, why each one that is not fully resolved is not, the claims
// they wait for and since when each pod volume's claim has been pending.
// The Resolver (resolver.go) reads the API objects; the loop puts what
// resolve returns into the desired state.
type Table struct {
	resolver *Resolver
	clock    clock.Clock
	// known are the pods added and not deleted, as last taken from the inbox.
	known map[types.UID]podvol.PodRef
	// unresolved says why a known pod is not (fully) in the desired state.
	unresolved map[types.UID]string
	// pending maps "namespace/claim" to the pods waiting for it, and
	// waiting a pod to the claims it waits for (pending's inverse: a
	// pod's resolution changes its own entries, however many others wait).
	pending map[string]map[types.UID]struct{}
	waiting map[types.UID][]string
	// pendingSince is when each pod volume's claim was first seen missing
	// or not bound (planner.Finality).
	pendingSince map[types.UID]map[string]time.Time
	// reading are the known pods a volume of which waits for a claim or
	// volume the object cache has not read yet (errNotRead), each true
	// when such a read is in flight (its first GET not answered yet,
	// objectcache.ErrNotAnswered, which peek marks errNotRead too) rather
	// than failing. Only ReadsInFlight, for the loop's idle (tests), reads
	// the value; it is taken at the resolution because the cache stores an
	// answer before it announces it, so asking the cache later could call
	// a read answered whose announcement has not reached the inbox yet.
	reading map[types.UID]bool
	// told is the event last recorded for each pod volume that failed to
	// resolve in a way the kubelet reports (resolutionEvents): recorded
	// once, again only when it changes.
	told map[types.UID]map[string]string
}

// NewTable returns an empty table of the pods r resolves.
func NewTable(r *Resolver, clk clock.Clock) *Table {
	return &Table{
		resolver: r, clock: clk,
		known:      map[types.UID]podvol.PodRef{},
		unresolved: map[types.UID]string{},
		pending:    map[string]map[types.UID]struct{}{},
		waiting:    map[types.UID][]string{},
		reading:    map[types.UID]bool{},
	}
}

// ExpansionClaim is the Resolver's ExpansionClaim: the PV of spec and
// the claim bound to it, for the planner's node expansion decision.
func (t *Table) ExpansionClaim(spec *podvol.VolumeSpec) (*v1.PersistentVolume, *v1.PersistentVolumeClaim) {
	return t.resolver.ExpansionClaim(spec)
}

// Forget drops a deleted pod.
func (t *Table) Forget(uid types.UID) {
	delete(t.known, uid)
	delete(t.unresolved, uid)
	delete(t.reading, uid)
	t.setPending(uid, nil)
	t.stampPending(uid, nil)
	delete(t.told, uid)
}

// WaitForListers records a pod added before the informers have listed
// what it refers to: it holds its mounts until it is resolved.
func (t *Table) WaitForListers(uid types.UID, ref podvol.PodRef) {
	t.known[uid] = ref
	t.unresolved[uid] = "waiting for the informers to list PVCs, PVs and CSIDrivers"
}

// Resolve resolves a pod into what the desired state takes (SetPod) and
// records how far it got.
func (t *Table) Resolve(pod *v1.Pod, logger klog.Logger) (ref podvol.PodRef, wanted []string, resolved []state.DesiredVolume, errs map[string]error) {
	uid := pod.UID
	t.known[uid] = PodRef(pod)
	ref, wanted, resolved, errs = t.resolver.ResolvePod(pod)
	t.stampPending(uid, errs)
	t.setPending(uid, waitingClaims(pod, errs))
	delete(t.reading, uid)
	for _, err := range errs {
		if errors.Is(err, errNotRead) {
			t.reading[uid] = t.reading[uid] || errors.Is(err, objectcache.ErrNotAnswered)
		}
	}
	if len(errs) == 0 {
		delete(t.unresolved, uid)
		return ref, wanted, resolved, errs
	}
	names := make([]string, 0, len(errs))
	for name, err := range errs {
		names = append(names, name)
		if errors.Is(err, errNodeNotListed) {
			// A wait of the start, not a failure: resolved again once
			// the Node informer has listed (Run's nodeChanged).
			logger.V(4).Info("Volume waits for the Node informer's first list", "pod", klog.KObj(pod), "volume", name)
			continue
		}
		if errors.Is(err, objectcache.ErrNotAnswered) {
			// Also a wait, as a pod added before the informers' first
			// list: resolved again when the read answers.
			logger.V(4).Info("Volume waits for the first read of its claim or volume", "pod", klog.KObj(pod), "volume", name)
			continue
		}
		logger.V(2).Info("Cannot resolve volume yet", "pod", klog.KObj(pod), "volume", name, "err", err)
	}
	sort.Strings(names)
	t.unresolved[uid] = fmt.Sprintf("pod %s cannot be resolved yet (volume %q: %v)", ref, names[0], errs[names[0]])
	return ref, wanted, resolved, errs
}

// Hold says why a known pod is not fully resolved, or "": its mounts are
// held meanwhile.
func (t *Table) Hold(uid types.UID) string { return t.unresolved[uid] }

// ReadsPending reports whether a known pod waits for a claim or volume
// the object cache has not read yet: until none does, the pods are not
// resolved as far as the API server allows (a pod that waits may want a
// volume found on disk), as before the informers' first list.
func (t *Table) ReadsPending() bool { return len(t.reading) > 0 }

// ReadsInFlight reports whether a known pod waits for a read of the
// object cache that has not answered yet (rather than one that failed):
// its answer is on its way and changes what the pods want.
func (t *Table) ReadsInFlight() bool {
	for _, asking := range t.reading {
		if asking {
			return true
		}
	}
	return false
}

// IsKnown reports whether pod uid is added and not deleted.
func (t *Table) IsKnown(uid types.UID) bool {
	_, ok := t.known[uid]
	return ok
}

// KnownUIDs returns the pods added and not deleted.
func (t *Table) KnownUIDs() []types.UID {
	out := make([]types.UID, 0, len(t.known))
	for uid := range t.known {
		out = append(out, uid)
	}
	return out
}

// WaitingFor returns the pods that wait for a claim ("namespace/name").
func (t *Table) WaitingFor(claim string) []types.UID {
	out := make([]types.UID, 0, len(t.pending[claim]))
	for uid := range t.pending[claim] {
		out = append(out, uid)
	}
	return out
}

// Again returns the pods to resolve again at a resync: the unresolved
// ones.
func (t *Table) Again() []types.UID {
	out := make([]types.UID, 0, len(t.unresolved))
	for uid := range t.unresolved {
		out = append(out, uid)
	}
	return out
}

// ClaimVolume returns the name of the PV a claim ("namespace/name") is
// bound to, "" when it is not known or not bound.
func (t *Table) ClaimVolume(claim string) string {
	ns, name, _ := cutKey(claim)
	pvc, err := t.resolver.PVCs.PersistentVolumeClaims(ns).Get(name)
	if err != nil {
		return ""
	}
	return pvc.Spec.VolumeName
}

// setPending records the claims a pod waits for.
func (t *Table) setPending(uid types.UID, claims []string) {
	for _, key := range t.waiting[uid] {
		pods := t.pending[key]
		delete(pods, uid)
		if len(pods) == 0 {
			delete(t.pending, key)
		}
	}
	if len(claims) == 0 {
		delete(t.waiting, uid)
		return
	}
	t.waiting[uid] = claims
	for _, key := range claims {
		if t.pending[key] == nil {
			t.pending[key] = map[types.UID]struct{}{}
		}
		t.pending[key][uid] = struct{}{}
	}
}

// ResolutionEvents returns the messages of the events to record for a
// pod's resolution errors, sorted: a volume whose plugin refused it
// with the kubelet's words for the failure (volume.Cause), which the
// kubelet meets in its SetUp (an emptyDir's hugepages medium that the
// pod's requests give no page size for, an unknown medium), gets the
// kubelet's event, "MountVolume.SetUp failed for volume <name> : <cause>";
// once per cause. Other resolution errors (a claim not bound, a source
// nodevol has no plugin for) the kubelet meets before any operation, and
// records no event for.
func (t *Table) ResolutionEvents(uid types.UID, errs map[string]error) (out []string) {
	old := t.told[uid]
	var now map[string]string
	for name, err := range errs {
		var kc volume.KubeletCauser
		if !errors.Is(err, planner.ErrUnknownSource) || !errors.As(err, &kc) {
			continue
		}
		msg := fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s", name, kc.KubeletCause())
		if now == nil {
			now = map[string]string{}
		}
		now[name] = msg
		if old[name] != msg {
			out = append(out, msg)
		}
	}
	sort.Strings(out)
	if now == nil {
		delete(t.told, uid)
		return out
	}
	if t.told == nil {
		t.told = map[types.UID]map[string]string{}
	}
	t.told[uid] = now
	return out
}

// stampPending wraps the pod's claim-pending errors with the time each was
// first seen for that pod volume; a volume that resolved, or failed
// otherwise, starts over. It runs at each resolution of the pod.
func (t *Table) stampPending(uid types.UID, errs map[string]error) {
	old := t.pendingSince[uid]
	var now map[string]time.Time // nil for the usual pod: nothing pending, nothing allocated
	for name, err := range errs {
		if !errors.Is(err, planner.ErrClaimPending) {
			continue
		}
		since, ok := old[name]
		if !ok {
			since = t.clock.Now()
		}
		if now == nil {
			now = map[string]time.Time{}
		}
		now[name] = since
		errs[name] = &planner.PendingClaimError{Err: err, Since: since}
	}
	if now == nil {
		delete(t.pendingSince, uid)
		return
	}
	if t.pendingSince == nil {
		t.pendingSince = map[types.UID]map[string]time.Time{}
	}
	t.pendingSince[uid] = now
}

// waitingClaims returns the "namespace/claim" keys of the pod's volumes that
// failed to resolve. Inline volumes wait for no claim; they resolve at once.
func waitingClaims(pod *v1.Pod, errs map[string]error) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		if errs[v.Name] == nil {
			continue
		}
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, pod.Namespace+"/"+v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Namespace+"/"+pod.Name+"-"+v.Name)
		}
	}
	return out
}

func cutKey(key string) (ns, name string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return "", key, false
}
