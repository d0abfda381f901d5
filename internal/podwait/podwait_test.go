package podwait

import (
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestSet(t *testing.T) {
	const pod, other = types.UID("p"), types.UID("q")
	for _, tt := range []struct {
		name string
		run  func(s *Set) (waiting []<-chan struct{}, woken []<-chan struct{})
		// held: pods with a channel left in the set
		held int
	}{
		{name: "one waiter gives back its channel: nothing kept", held: 0,
			run: func(s *Set) (_, _ []<-chan struct{}) {
				ch := s.Changed(pod)
				s.Done(pod, ch)
				return nil, nil
			}},
		{name: "two waiters, one gives back: a wake still reaches the other", held: 0,
			run: func(s *Set) (_, woken []<-chan struct{}) {
				a, b := s.Changed(pod), s.Changed(pod)
				s.Done(pod, a)
				s.Wake(pod)
				return nil, []<-chan struct{}{b}
			}},
		{name: "two waiters, one gives back: the channel is kept for the other", held: 1,
			run: func(s *Set) (waiting, _ []<-chan struct{}) {
				a, b := s.Changed(pod), s.Changed(pod)
				s.Done(pod, a)
				return []<-chan struct{}{b}, nil
			}},
		{name: "a woken channel given back does not release the next round's", held: 1,
			run: func(s *Set) (waiting, woken []<-chan struct{}) {
				old := s.Changed(pod)
				s.Wake(pod)
				next := s.Changed(pod)
				s.Done(pod, old)
				return []<-chan struct{}{next}, []<-chan struct{}{old}
			}},
		{name: "a wake is per pod", held: 1,
			run: func(s *Set) (waiting, woken []<-chan struct{}) {
				a, b := s.Changed(pod), s.Changed(other)
				s.Wake(pod)
				return []<-chan struct{}{b}, []<-chan struct{}{a}
			}},
		{name: "done without a channel held does nothing", held: 0,
			run: func(s *Set) (_, _ []<-chan struct{}) {
				s.Done(pod, make(chan struct{}))
				s.Wake(pod)
				return nil, nil
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s Set
			waiting, woken := tt.run(&s)
			for i, ch := range waiting {
				if closed(ch) {
					t.Errorf("waiting channel %d closed", i)
				}
			}
			for i, ch := range woken {
				if !closed(ch) {
					t.Errorf("woken channel %d not closed", i)
				}
			}
			if got := s.Len(); got != tt.held {
				t.Errorf("Len() = %d, want %d", got, tt.held)
			}
		})
	}
}

// TestUnder: ChangedUnder and DoneUnder take the owner's lock around
// Changed and Done, and leave it unlocked.
func TestUnder(t *testing.T) {
	var mu sync.Mutex
	var s Set
	ch := s.ChangedUnder(&mu, "a")
	if !mu.TryLock() {
		t.Fatal("ChangedUnder left the lock held")
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d after ChangedUnder, want 1", s.Len())
	}
	mu.Unlock()
	s.DoneUnder(&mu, "a", ch)
	if !mu.TryLock() {
		t.Fatal("DoneUnder left the lock held")
	}
	mu.Unlock()
	if s.Len() != 0 {
		t.Errorf("Len = %d after DoneUnder, want 0", s.Len())
	}
}
