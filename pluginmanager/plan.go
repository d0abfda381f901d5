package pluginmanager

import (
	"os"
	"time"
)

// desiredPlugin is a socket that exists in the registration directory.
type desiredPlugin struct {
	// gen changes whenever the socket is created again.
	gen uint64
	// file identifies the socket file, to tell a re-created socket from
	// the same one when rescanning.
	file os.FileInfo
	// seen is when the socket was first seen.
	seen time.Time
}

// actualPlugin is a registered plugin.
type actualPlugin struct {
	// gen is the desiredPlugin.gen it was registered from.
	gen  uint64
	info PluginInfo
	// handler registered it and deregisters it.
	handler Handler
}

// retry is a socket's retry state after failed operations.
type retry struct {
	// dereg: the failures were deregistrations of generation gen; else
	// registrations of generation gen. A backoff applies only to the same
	// kind of operation on the same generation.
	dereg    bool
	gen      uint64
	failures int
	// until is the earliest time of the next attempt.
	until time.Time
}

// step is what to do next for one socket.
type step int

const (
	// stepNone: desired and actual agree, nothing to do.
	stepNone step = iota
	// stepRegister: the socket exists and no plugin is registered from it.
	stepRegister
	// stepDeregister: a plugin is registered from a socket that has gone
	// or was created again.
	stepDeregister
	// stepWait: an operation is due but its backoff has not expired.
	stepWait
)

func (s step) String() string {
	switch s {
	case stepNone:
		return "none"
	case stepRegister:
		return "register"
	case stepDeregister:
		return "deregister"
	case stepWait:
		return "wait"
	}
	return "unknown"
}

// plan decides the next step for one socket that no operation is running
// for, from its desired entry d (nil: no socket), its actual entry a (nil:
// not registered) and its backoff b (nil: none). For stepWait it also
// returns when to decide again. Deregistration of a stale plugin always
// comes before registration of the socket's new generation. plan does no
// I/O and reads no clock.
func plan(d *desiredPlugin, a *actualPlugin, b *retry, now time.Time) (step, time.Time) {
	dereg, gen, ok := due(d, a)
	if !ok {
		return stepNone, time.Time{}
	}
	if b != nil && b.gen == gen && b.dereg == dereg && now.Before(b.until) {
		return stepWait, b.until
	}
	if dereg {
		return stepDeregister, time.Time{}
	}
	return stepRegister, time.Time{}
}

// due returns the operation that desired entry d and actual entry a call
// for, if any: a deregistration of generation gen (dereg), or a
// registration of generation gen.
func due(d *desiredPlugin, a *actualPlugin) (dereg bool, gen uint64, ok bool) {
	switch {
	case a != nil && (d == nil || d.gen != a.gen):
		return true, a.gen, true
	case d != nil && a == nil:
		return false, d.gen, true
	}
	return false, 0, false
}

// applies reports whether b is the backoff of the operation due for d and
// a; other backoffs are stale.
func (b *retry) applies(d *desiredPlugin, a *actualPlugin) bool {
	dereg, gen, ok := due(d, a)
	return ok && b.dereg == dereg && b.gen == gen
}
