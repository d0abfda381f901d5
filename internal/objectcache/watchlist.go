package objectcache

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/watchlist"
)

// A watch-list request (a watch with sendInitialEvents=true and
// resourceVersionMatch=NotOlderThan, KEP 3157) reads an entry's objects
// and goes on watching them with one request: the server first sends
// each object as an ADDED event, then a BOOKMARK annotated
// metav1.InitialEventsAnnotationKey, then the changes. This is how the
// kubelet's reflectors read (client-go's WatchListClient, on by default
// since 1.35).
//
// A server that does not support it either refuses the request (422
// Invalid, as a server with its WatchList feature gate off does, or 400)
// or ignores the parameter and sends a plain watch, which shows as an
// event other than ADDED (a MODIFIED, a DELETED, a bookmark without the
// annotation) before the annotated bookmark. Either way the cache reads
// with a list and then a watch from then on, as it does for a client that
// says it does not support watch-list semantics (the fake clientset) or
// with client-go's WatchListClient feature turned off.

// errNoWatchList: the server does not support watch-list requests; the
// entry lists instead, at once.
var errNoWatchList = errors.New("the API server does not support watch-list requests")

// streams reports whether the cache reads a fresh entry with a watch-list
// request.
func (c *Cache) streams() bool { return !c.noStream.Load() }

// streamsWith reports whether a watch-list request may be tried with
// client: client-go's WatchListClient feature is on, and the client does
// not say it lacks watch-list semantics.
func streamsWith(client kubernetes.Interface) bool {
	return clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) &&
		!watchlist.DoesClientNotSupportWatchListSemantics(client)
}

// noWatchList remembers that the server does not support watch-list
// requests, for every entry of the cache, and returns errNoWatchList.
func (c *Cache) noWatchList(ctx context.Context, e *entry, why error) error {
	if !c.noStream.Swap(true) {
		logger(ctx, e).Info("Watch-list requests not supported, listing and watching instead", "err", why)
	}
	return errNoWatchList
}

// refusesWatchList reports the error of a server that does not accept
// sendInitialEvents.
func refusesWatchList(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}

// initialEvents gathers the initial state a watch-list request streams.
type initialEvents struct {
	objs []runtime.Object
}

// add takes one event of the initial state. It reports the bookmark that
// ends it, and an error when the event shows the server ignored
// sendInitialEvents (the stream is a plain watch).
func (s *initialEvents) add(ev watch.Event) (ended bool, err error) {
	switch ev.Type {
	case watch.Added:
		s.objs = append(s.objs, ev.Object)
		return false, nil
	case watch.Bookmark:
		if o, aerr := meta.Accessor(ev.Object); aerr == nil && o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
			return true, nil
		}
	}
	return false, fmt.Errorf("a %s event before the end of the initial events", ev.Type)
}
