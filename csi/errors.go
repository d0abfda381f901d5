package csi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodevol/nodevol/volume"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CallError is the error of a failed CSI call. It unwraps to the gRPC error
// (status.FromError and status.Code still work on it and on errors that
// wrap it), to volume.ErrInProgress when the call may still be
// running on the driver's side, and to the caller's context error when the
// caller's context ended.
type CallError struct {
	// Driver is the CSI driver's name and Method the gRPC method
	// ("NodeStageVolume").
	Driver, Method string
	// Code is the gRPC code; codes.Unknown for an error without a status.
	Code codes.Code
	// InProgress reports whether the operation may have started and may
	// still finish (see isInProgressCode).
	InProgress bool
	// Err is the error the gRPC client returned.
	Err    error
	ctxErr error
}

// Error implements error.
func (e *CallError) Error() string {
	return fmt.Sprintf("CSI %s of driver %s failed: %v", e.Method, e.Driver, e.Err)
}

// KubeletCause is the kubelet's words for the failed call: the gRPC
// error's text, as the kubelet's CSI client returns it
// (volume.KubeletCauser).
func (e *CallError) KubeletCause() string { return e.Err.Error() }

// Unwrap returns the gRPC error, ErrInProgress when InProgress, and the
// caller's context error when it ended.
func (e *CallError) Unwrap() []error {
	errs := []error{e.Err}
	if e.InProgress {
		errs = append(errs, volume.ErrInProgress)
	}
	if e.ctxErr != nil {
		errs = append(errs, e.ctxErr)
	}
	return errs
}

// GRPCStatus returns the call's gRPC status, for status.FromError.
func (e *CallError) GRPCStatus() *status.Status {
	if s, ok := status.FromError(e.Err); ok {
		return s
	}
	return status.New(codes.Unknown, e.Err.Error())
}

// isInProgressCode reports whether a call that failed with code may have
// started and may still finish: Canceled, DeadlineExceeded, Unavailable,
// ResourceExhausted and Aborted, as the kubelet treats them. A volume whose
// stage or publish failed so is uncertain, not unmounted.
func isInProgressCode(code codes.Code) bool {
	switch code {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// IsResourceExhausted reports whether err is, or wraps, the error of a
// CSI call that failed with ResourceExhausted: the driver has no room on
// the node for one more volume (a NodeStageVolume or NodePublishVolume of
// a driver that counts its volumes there).
func IsResourceExhausted(err error) bool {
	return status.Code(err) == codes.ResourceExhausted
}

// classify turns the error of a CSI call into a *CallError. Errors that
// carry no gRPC status (transport failures) are in progress too.
func classify(ctx context.Context, driver, method string, err error) error {
	if err == nil {
		return nil
	}
	ce := &CallError{Driver: driver, Method: method, Err: err, ctxErr: callerErr(ctx)}
	if s, ok := status.FromError(err); ok {
		ce.Code = s.Code()
		ce.InProgress = isInProgressCode(ce.Code)
	} else {
		ce.Code = codes.Unknown
		ce.InProgress = true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		ce.InProgress = true
	}
	return ce
}

// callerErr returns the caller's context error. gRPC runs its own timer for
// the deadline, which can fire a moment before the context's, so a passed
// deadline counts as DeadlineExceeded even while ctx.Err() is still nil.
func callerErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
