package fsgroup

import (
	"context"
	"time"
)

// Observer is told of each ownership change that ran (not one that
// OnRootMismatch skipped): how long it took and its error, for the
// kubelet's volume_apply_access_control series.
type Observer func(took time.Duration, err error)

type observerKey struct{}

// WithObserver returns ctx carrying o: the changes made with it (Reporter.Change,
// Observe) are told to o. The volume manager sets one per operation, so
// that every plugin that changes ownership is measured without a
// parameter of its own.
func WithObserver(ctx context.Context, o Observer) context.Context {
	return context.WithValue(ctx, observerKey{}, o)
}

// Observe tells ctx's Observer, if any, of an ownership change that ran:
// for a plugin that gives the group while it writes its files (the
// atomic writer) rather than by a walk.
func Observe(ctx context.Context, took time.Duration, err error) {
	if o, ok := ctx.Value(observerKey{}).(Observer); ok && o != nil {
		o(took, err)
	}
}
