// Package podwait hands out channels that are closed at the next change of
// a pod's state, and forgets a channel once nobody waits on it: a channel
// kept for each pod until its next change would stay for as long as the
// pod runs (about 150 bytes per pod at rest, and two such sets per pod).
package podwait

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Set holds the waiters of each pod. It has no lock: its owner guards it
// with the lock that guards the state whose changes it announces. The zero
// Set is ready to use.
type Set struct {
	m map[types.UID]*waiters
}

// waiters is one pod's channel and how many callers hold it.
type waiters struct {
	ch chan struct{}
	n  int
}

// Changed returns a channel closed at the next Wake of the pod. Every
// caller gives it back with Done once it stops waiting.
func (s *Set) Changed(uid types.UID) <-chan struct{} {
	w := s.m[uid]
	if w == nil {
		if s.m == nil {
			s.m = map[types.UID]*waiters{}
		}
		w = &waiters{ch: make(chan struct{})}
		s.m[uid] = w
	}
	w.n++
	return w.ch
}

// Done gives back a channel from Changed: once no caller holds the pod's
// channel it is dropped. A channel already closed by Wake (or of an
// earlier round) is no longer held: Done does nothing then.
func (s *Set) Done(uid types.UID, ch <-chan struct{}) {
	w := s.m[uid]
	if w == nil || (<-chan struct{})(w.ch) != ch {
		return
	}
	if w.n--; w.n <= 0 {
		delete(s.m, uid)
	}
}

// ChangedUnder is Changed with mu held, for an owner that hands out
// channels from outside its lock.
func (s *Set) ChangedUnder(mu sync.Locker, uid types.UID) <-chan struct{} {
	mu.Lock()
	defer mu.Unlock()
	return s.Changed(uid)
}

// DoneUnder is Done with mu held.
func (s *Set) DoneUnder(mu sync.Locker, uid types.UID, ch <-chan struct{}) {
	mu.Lock()
	defer mu.Unlock()
	s.Done(uid, ch)
}

// Wake closes the pod's channel: every waiter returns and takes a new one
// if it waits again.
func (s *Set) Wake(uid types.UID) {
	if w := s.m[uid]; w != nil {
		close(w.ch)
		delete(s.m, uid)
	}
}

// Len returns the number of pods with a channel held.
func (s *Set) Len() int { return len(s.m) }
