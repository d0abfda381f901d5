package reconciler

import (
	"slices"
	"sync"

	"github.com/nodevol/nodevol/podvol"
)

// volumeNotes are what the loop last learnt of each volume that the pods'
// errors do not hold, for WaitForUnstaged's error: why its due work waits (the
// planner's words) and the last error of an operation on the whole volume
// (a stage, an unstage, an attach, a detach: once its pods are gone no pod
// carries it). The loop writes them; waiters read them.
type volumeNotes struct {
	mu      sync.Mutex
	waiting map[podvol.UniqueVolumeName][]string
	errs    map[podvol.UniqueVolumeName]error
}

func (n *volumeNotes) setWaiting(name podvol.UniqueVolumeName, why []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(why) == 0 {
		delete(n.waiting, name)
		return
	}
	if n.waiting == nil {
		n.waiting = map[podvol.UniqueVolumeName][]string{}
	}
	n.waiting[name] = why
}

// setErr records the last error of an operation on the whole volume; nil
// (it succeeded) forgets it.
func (n *volumeNotes) setErr(name podvol.UniqueVolumeName, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil {
		delete(n.errs, name)
		return
	}
	if n.errs == nil {
		n.errs = map[podvol.UniqueVolumeName]error{}
	}
	n.errs[name] = err
}

// forget drops the notes of a volume the loop forgets.
func (n *volumeNotes) forget(name podvol.UniqueVolumeName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.waiting, name)
	delete(n.errs, name)
}

func (n *volumeNotes) get(name podvol.UniqueVolumeName) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.waiting[name]), n.errs[name]
}
