package volume

import (
	"errors"
	"fmt"
)

// The kubelet's words for a failure.
//
// The volume manager records a failed operation as an event on the pod in
// the kubelet v1.37's words, as users, dashboards and upstream's
// conformance tests read them: the kubelet's step that failed, the volume
// as the kubelet names it, then the cause:
//
//	MountVolume.SetUp failed for volume "cm" : configmap "cm-x" not found
//
// The step and the volume's name follow from the operation. The cause is
// the plugin's: a plugin marks the part of its error that is the
// kubelet's text for the same failure with Cause (or makes it with
// Causef), and wraps it in its own context (which pod, volume, driver,
// path), which the volume manager's logs and wait errors keep; or it
// attaches the kubelet's words to its own error with WithCause. An error
// with no mark is its own cause, context and all: the kubelet has no text
// for that failure. A plugin whose operation does what several steps of
// the kubelet's do marks a failure of a step other than the operation's
// first with AtStep.

// KubeletCauser is an error that knows the kubelet's words for itself:
// those of Cause and WithCause, and a CSI call's error (the driver's gRPC
// status, as the kubelet prints it).
type KubeletCauser interface {
	error
	// KubeletCause is the kubelet's text of the failure.
	KubeletCause() string
}

// causeError is an error whose text is the kubelet's.
type causeError struct{ err error }

func (e *causeError) Error() string        { return e.err.Error() }
func (e *causeError) Unwrap() error        { return e.err }
func (e *causeError) KubeletCause() string { return e.err.Error() }

// Cause marks err's text as the kubelet's words for the failure, what a
// pod's event says after the step and the volume. errors.Is and errors.As
// see through the mark, and its text is err's. Cause(nil) is nil.
func Cause(err error) error {
	if err == nil {
		return nil
	}
	return &causeError{err: err}
}

// Causef is Cause(fmt.Errorf(format, args...)): a cause in the kubelet's
// words, which may wrap what it reports (%w).
func Causef(format string, args ...any) error {
	return &causeError{err: fmt.Errorf(format, args...)}
}

// wordedError is an error with the kubelet's words for it beside its own.
type wordedError struct {
	err   error
	words string
}

func (e *wordedError) Error() string        { return e.err.Error() }
func (e *wordedError) Unwrap() error        { return e.err }
func (e *wordedError) KubeletCause() string { return e.words }

// WithCause returns err with the kubelet's words for the same failure:
// its text stays err's (nodevol's, for logs and wait errors), a pod's
// event says words. For a failure the kubelet words differently, where
// nodevol's text says more. WithCause(nil, words) is nil.
func WithCause(err error, words string) error {
	if err == nil {
		return nil
	}
	return &wordedError{err: err, words: words}
}

// The kubelet's steps that a plugin names with AtStep, as its events
// begin: where nodevol's one operation does what several steps of the
// kubelet's do, the kubelet's events name the step that failed.
const (
	// StepMapBlockVolume is the node's own mapping of a published raw
	// block device into the pod (the bind mount held by a loop device,
	// the pod's symlink), after the plugin's publish: the kubelet's
	// util.MapBlockVolume. A raw block publish's other failures are
	// "MapVolume.MapPodDevice failed".
	StepMapBlockVolume = "MapVolume.MapBlockVolume failed"
	// StepUnmapBlockVolume is the node's own unmapping of a raw block
	// device from the pod (symlink, loop device, bind mount): the
	// kubelet's util.UnmapBlockVolume. A raw block unpublish's other
	// failures are "UnmapVolume.UnmapPodDevice failed".
	StepUnmapBlockVolume = "UnmapVolume.UnmapBlockVolume failed"
	// StepRemoveMapPath is the removal of a raw block volume's node-wide
	// map directory once its device is torn down. A raw block unstage's
	// other failures are "UnmapDevice.TearDownDevice failed".
	StepRemoveMapPath = "UnmapDevice.RemoveMapPath failed"
)

// stepError says which of the kubelet's steps failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// AtStep marks err as the failure of the kubelet's step (StepMapBlockVolume,
// ...). Its text is err's; errors.Is and errors.As see through it.
// AtStep(step, nil) is nil.
func AtStep(step string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{step: step, err: err}
}

// EventCause returns what a pod's event says of a plugin's error err: the
// kubelet's step that failed, when err is marked with AtStep ("" for the
// operation's own), and the cause: the kubelet's text of the outermost
// error in err's chain that has one (KubeletCauser), else err's own text.
func EventCause(err error) (step, cause string) {
	var s *stepError
	if errors.As(err, &s) {
		step = s.step
	}
	var kc KubeletCauser
	if errors.As(err, &kc) {
		return step, kc.KubeletCause()
	}
	return step, err.Error()
}
