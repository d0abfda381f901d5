package objectcache

import (
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
)

// entry is the cache's one entry for a Ref: what its read last answered,
// and how it is kept current (a watch loop, or ModeGet reads). Its fields
// before mu are set when it is made and changed only under the Cache's
// lock.
type entry struct {
	ref  Ref
	kind kindInfo
	m    matcher
	// invalid: the ref cannot be read (err says why); it has no loop.
	invalid bool
	// holders are the holders that hold the ref, sorted.
	holders []string
	// stop ends the entry's reads (nil while they have not started).
	stop func()
	// get is the schedule of a ModeGet entry's reads (nil for a watch
	// entry); it has its own lock.
	get *getState
	// dropped is closed when the last holder lets go: a Get waiting for
	// the first answer returns.
	dropped chan struct{}

	mu sync.Mutex
	// answered is closed at the first answer (objects or an error).
	answered chan struct{}
	// have: an answer with objects (possibly none) came; objs then holds
	// them (at most one for a named ref) and later errors do not hide
	// them.
	have bool
	objs []runtime.Object
	// err is the last read's error, kept for Get while nothing is had.
	err error
	// immutable: the object is immutable and no longer read.
	immutable bool
	// peeked: a Peek found no answer yet; the first answer (and, while
	// no object is had, a new error) is then announced, since the
	// reader did not wait for it.
	peeked bool
}

func newEntry(r Ref) *entry {
	e := &entry{ref: r, dropped: make(chan struct{}), answered: make(chan struct{})}
	k, m, err := parse(r)
	e.kind, e.m = k, m
	if err != nil {
		e.err, e.invalid = err, true
		close(e.answered)
	}
	return e
}

// answer returns what the entry holds: its objects, or the error of its
// reads while it has none.
func (e *entry) answer() ([]runtime.Object, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.have {
		return nil, e.err
	}
	return e.objs, nil
}

// replace sets the objects of a full read (a list or a GET) and reports
// whether a Get now answers differently than before, after the first
// answer (the first one is what a Get waits for, not a change).
func (e *entry) replace(objs []runtime.Object) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := objs[:0:0]
	for _, o := range objs {
		if e.m.matches(e.kind, o) {
			kept = append(kept, o)
		}
	}
	slices.SortFunc(kept, byName)
	changed := e.have && !sameObjects(e.objs, kept)
	if !e.have && (e.err != nil || e.peeked) {
		changed = true // an error answered first, or a Peek did not wait: the objects appear
	}
	e.objs, e.have, e.err = kept, true, nil
	e.answeredLocked()
	return changed
}

// upsert applies an added or modified object of a watch: kept when the
// ref holds it, else removed (a label that no longer matches).
func (e *entry) upsert(obj runtime.Object) bool {
	if !e.m.matches(e.kind, obj) {
		return e.remove(obj)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearchFunc(e.objs, obj, byName)
	if !found {
		e.objs = slices.Insert(slices.Clip(e.objs), i, obj)
		return true
	}
	if sameObject(e.objs[i], obj) {
		return false
	}
	objs := slices.Clone(e.objs) // a Get may hold the old slice
	objs[i] = obj
	e.objs = objs
	return true
}

// remove applies a deleted object of a watch.
func (e *entry) remove(obj runtime.Object) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found := slices.BinarySearchFunc(e.objs, obj, byName)
	if !found {
		return false
	}
	e.objs = slices.Delete(slices.Clone(e.objs), i, i+1)
	return true
}

// byName orders an entry's objects (one kind, one namespace) by name.
func byName(a, b runtime.Object) int { return strings.Compare(nameOf(a), nameOf(b)) }

// fail records a read's error. The objects had stay: a Get keeps
// answering the last known state, as the kubelet's managers do. It
// reports whether a Peek now answers differently: the first answer, or a
// new error while no object is had, of an entry a Peek did not wait for.
func (e *entry) fail(err error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := e.peeked && !e.have && (e.err == nil || e.err.Error() != err.Error())
	e.err = err
	e.answeredLocked()
	return changed
}

// peek returns what the entry holds as answer does, or ErrNotAnswered
// (and marks the entry peeked) before its first answer.
func (e *entry) peek() ([]runtime.Object, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-e.answered:
	default:
		e.peeked = true
		return nil, ErrNotAnswered
	}
	if !e.have {
		return nil, e.err
	}
	return e.objs, nil
}

// immutableNow reports a named object that is immutable, and records it:
// its reads end.
func (e *entry) immutableNow() bool {
	if e.kind.immutable == nil || e.m.name == "" {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.objs) != 1 || !e.kind.immutable(e.objs[0]) {
		return false
	}
	e.immutable = true
	return true
}

func (e *entry) answeredLocked() {
	select {
	case <-e.answered:
	default:
		close(e.answered)
	}
}

func nameOf(obj runtime.Object) string {
	o, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return o.GetName()
}

func resourceVersion(obj runtime.Object) string {
	o, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return o.GetResourceVersion()
}

// sameObject: the same resourceVersion, or, where there is none (the fake
// clientset does not set it), the same content.
func sameObject(a, b runtime.Object) bool {
	ra, rb := resourceVersion(a), resourceVersion(b)
	if ra != "" && rb != "" {
		return ra == rb
	}
	return equality.Semantic.DeepEqual(a, b)
}

func sameObjects(a, b []runtime.Object) bool {
	return slices.EqualFunc(a, b, func(x, y runtime.Object) bool {
		return nameOf(x) == nameOf(y) && sameObject(x, y)
	})
}
