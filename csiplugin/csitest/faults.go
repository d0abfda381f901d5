package csitest

import (
	"context"
	"time"

	"google.golang.org/grpc/status"
)

// Fault makes matching calls fail, wait, or both. A call matches when
// Method and VolumeID match it (empty matches anything); the first matching
// fault, in the order they were injected, applies to a call, and a fault
// applies to at most Times calls.
//
// A call that a fault applies to first waits for Delay and for Block, and
// fails with the gRPC status of the request's context error (Canceled or
// DeadlineExceeded) if its context ends while it waits, or with Unavailable
// if the server stops. It then fails with Err if Err is set, and otherwise
// goes on as usual. Unless Commit is set, a failed call changes nothing.
type Fault struct {
	// Method is the RPC's short name, e.g. "NodeStageVolume". Empty
	// matches every method.
	Method string
	// VolumeID is the request's volume_id. Empty matches every volume.
	VolumeID string
	// Err is the error the call returns, normally a gRPC status error such
	// as status.Error(codes.Unavailable, "..."). Nil: the call succeeds
	// after the wait.
	Err error
	// Delay is how long the call waits before it goes on.
	Delay time.Duration
	// Block, when not nil, holds the call until it is closed. Use it to
	// hold an operation in flight while the test looks at nodevol's state
	// (Server.WaitForCalls tells when the call has arrived).
	Block <-chan struct{}
	// Times is how many calls the fault applies to; 0 means every matching
	// call until ClearFaults.
	Times int
	// Commit makes the call change the server's state (stage, publish, ...)
	// even though it fails: a driver that did the work but whose answer
	// was lost or late. The state change happens after the wait, even when
	// the wait ended with the context.
	Commit bool
}

// fault is an injected Fault and how many more calls it applies to.
type fault struct {
	Fault
	left int // meaningful only when Times > 0
}

// Inject adds a fault. It applies to calls that arrive after Inject returns.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{Fault: f, left: f.Times})
}

// ClearFaults removes every fault. Calls that a fault already holds keep
// waiting for it.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// takeFault returns the fault that applies to a call, using up one of its
// Times, or nil. The caller holds s.mu.
func (s *Server) takeFault(method, volumeID string) *Fault {
	for i, f := range s.faults {
		if (f.Method != "" && f.Method != method) || (f.VolumeID != "" && f.VolumeID != volumeID) {
			continue
		}
		if f.Times > 0 {
			f.left--
			if f.left == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		out := f.Fault
		return &out
	}
	return nil
}

// hold waits for a fault's Delay and Block. It returns the status error of
// ctx if ctx ends first, and errStopped if the server stops first.
func (s *Server) hold(ctx context.Context, f *Fault) error {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopped:
			return errStopped
		}
	}
	if f.Block != nil {
		select {
		case <-f.Block:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopped:
			return errStopped
		}
	}
	return nil
}
