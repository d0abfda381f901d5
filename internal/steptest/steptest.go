// Package steptest stops a process at a chosen step (package step): the
// crash-point suites' hook.
package steptest

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nodevol/nodevol/step"
)

// errCrashed is wrapped by what a refused step returns.
var errCrashed = errors.New("crash point: the process stopped here")

// Crasher is a step.Hook (Take) that counts the steps it is shown once
// armed and refuses the at-th and every step after it, so that nothing
// changes on the node from that step on: what a process killed just before
// it leaves. Safe for concurrent use.
type Crasher struct {
	mu      sync.Mutex
	armed   bool
	at      int
	stopped bool
	crashed chan struct{}
	taken   []step.Step
	stop    step.Step
	check   func(step.Step)
}

// New returns a Crasher that is not armed: it takes every step, counting
// none. check, if set, sees every step taken, armed or not (a test's
// invariant on each step, such as no unstage under a publish).
func New(check func(step.Step)) *Crasher {
	return &Crasher{crashed: make(chan struct{}), check: check}
}

// Arm starts counting from the next step and stops at the at-th (at 0:
// never).
func (c *Crasher) Arm(at int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.at, c.taken = true, at, nil
}

// Take is the step.Hook.
func (c *Crasher) Take(s step.Step) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errCrashed
	}
	if c.armed && len(c.taken)+1 == c.at {
		c.stopped, c.stop = true, s
		close(c.crashed)
		return fmt.Errorf("%w: step %d, %s", errCrashed, c.at, s)
	}
	if c.armed {
		c.taken = append(c.taken, s)
	}
	if c.check != nil {
		c.check(s)
	}
	return nil
}

// Crashed is closed when the Crasher stops.
func (c *Crasher) Crashed() <-chan struct{} { return c.crashed }

// Steps returns the steps taken since Arm, and the step stopped at (nil
// if none).
func (c *Crasher) Steps() ([]step.Step, *step.Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped {
		return slices.Clone(c.taken), nil
	}
	stop := c.stop
	return slices.Clone(c.taken), &stop
}
