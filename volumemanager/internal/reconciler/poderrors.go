package reconciler

import (
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/podwait"
)

// podErrors holds the last error of each pod's volumes, by spec name, for
// the wait errors. The loop writes it; waiters read it.
type podErrors struct {
	mu   sync.Mutex
	errs map[types.UID]map[string]error
	// waiters are closed at the next change of a pod's errors.
	waiters podwait.Set
}

// locked runs fn under the lock.
func (p *podErrors) locked(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn()
}

// changed returns a channel closed at the next change of the pod's errors
// (or of its resolution errors, which the loop announces with wake).
// Every caller gives it back with waitDone.
func (p *podErrors) changed(uid types.UID) (ch <-chan struct{}) {
	p.locked(func() { ch = p.waiters.Changed(uid) })
	return ch
}

// waitDone gives back a channel from changed, so that it is not kept while
// nobody waits on it.
func (p *podErrors) waitDone(uid types.UID, ch <-chan struct{}) {
	p.locked(func() { p.waiters.Done(uid, ch) })
}

// wake wakes the pod's waiters.
func (p *podErrors) wake(uid types.UID) { p.locked(func() { p.waiters.Wake(uid) }) }

func (p *podErrors) set(uid types.UID, specName string, err error) {
	p.locked(func() {
		if p.errs == nil {
			p.errs = map[types.UID]map[string]error{}
		}
		m := p.errs[uid]
		if m == nil {
			m = map[string]error{}
			p.errs[uid] = m
		}
		m[specName] = err
		p.waiters.Wake(uid)
	})
}

func (p *podErrors) clear(uid types.UID, specName string) {
	p.locked(func() {
		if m := p.errs[uid]; m != nil {
			delete(m, specName)
			if len(m) == 0 {
				delete(p.errs, uid)
			}
			p.waiters.Wake(uid)
		}
	})
}

func (p *podErrors) forget(uid types.UID) {
	p.locked(func() {
		delete(p.errs, uid)
		p.waiters.Wake(uid)
	})
}

func (p *podErrors) get(uid types.UID) (out map[string]error) {
	p.locked(func() {
		out = make(map[string]error, len(p.errs[uid]))
		maps.Copy(out, p.errs[uid])
	})
	return out
}
