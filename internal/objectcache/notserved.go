package objectcache

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ErrNotServed is wrapped by the error of a read of a kind whose API the
// API server does not serve (ClusterTrustBundles through
// certificates.k8s.io/v1 before Kubernetes 1.37). Such an error is not
// apierrors.IsNotFound: the object may well exist, and an optional source
// must not be taken for a missing one. The read is retried with backoff
// like any failed read, since the API server may be upgraded.
var ErrNotServed = errors.New("API not served")

// notServedError is a read's 404 that says the API is not served. It
// keeps the API server's text but does not unwrap to its StatusError,
// which apierrors.IsNotFound would take for a missing object.
type notServedError struct {
	api    string // group/version, as "certificates.k8s.io/v1"
	kind   Kind
	since  string // the first Kubernetes version that serves it ("": any)
	status string // the API server's answer
}

func (e *notServedError) Error() string {
	msg := fmt.Sprintf("the API server does not serve %s %ss", e.api, e.kind)
	if e.since != "" {
		msg += fmt.Sprintf(": a %s or newer API server is needed", e.since)
	}
	return fmt.Sprintf("%s (%s)", msg, e.status)
}

// Is makes errors.Is(err, ErrNotServed) true.
func (e *notServedError) Is(target error) bool { return target == ErrNotServed }

// served returns err, or a notServedError when err is the API server's
// 404 for a path it does not serve rather than for a missing object.
//
// Both are apierrors.IsNotFound. A missing object's 404 comes from the
// resource's storage, with details naming its resource and name. A path
// no API serves is answered by the server's mux: a Status with empty
// details (the go-restful container of a served group version, as
// certificates.k8s.io/v1 is for CSRs), or a plain-text "404 page not
// found" that client-go turns into a StatusError whose cause says the
// response was unexpected.
func (k kindInfo) served(kind Kind, err error) error {
	if !apierrors.IsNotFound(err) {
		return err
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return err
	}
	d := status.Status().Details
	if d != nil && d.Kind != "" && !apierrors.IsUnexpectedServerError(err) {
		return err
	}
	api := k.version
	if k.resource.Group != "" {
		api = k.resource.Group + "/" + k.version
	}
	return &notServedError{api: api, kind: kind, since: k.since, status: err.Error()}
}
