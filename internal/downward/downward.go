// Package downward computes the files of a downwardAPI volume, or of a
// projected volume's downwardAPI source, from the pod: the kubelet's
// downwardapi.CollectData (v1.37), with its field paths, its formats, its
// rounding and its error texts. It is pure: no I/O, no clock; the node's
// allocatable resources, which stand for a limit a container does not
// declare, are an argument.
//
// What it does, as the kubelet does:
//
//   - fieldRef: metadata.name, metadata.namespace, metadata.uid,
//     metadata.labels and metadata.annotations (every pair on a line of
//     its own, key="value" with the value quoted as Go quotes a string,
//     sorted by key, no newline after the last), metadata.labels['key'] and
//     metadata.annotations['key'] (the value alone, "" when the key is
//     absent; the key checked to be a qualified name, lower-cased for
//     annotations). The fieldRef's apiVersion is ignored, as the kubelet
//     ignores it.
//   - resourceFieldRef: limits.* and requests.* of cpu, memory,
//     ephemeral-storage and hugepages-<size> of the named container (regular
//     containers first, then init containers), divided by the divisor (1
//     when unset or zero) and rounded up; a limit of cpu, memory or
//     ephemeral-storage that the container does not declare (or declares
//     zero) is the node's allocatable amount. Pod-level limits
//     (spec.resources.limits) are not read: since 1.34 the kubelet puts
//     them before the node's allocatable amount for a container's
//     environment variables only (defaultPodLimitsForDownwardAPI, called
//     from makeEnvironmentVariables); its downwardAPI volume plugin in
//     1.37 still goes from the container's limit to the node's.
//   - the file's path is cleaned, its mode is the item's or the default
//     mode, its owner (with the alpha AtomicWriteVolumeUserFields) the
//     item's user or the default user.
//   - every item's error is reported, aggregated as the kubelet aggregates
//     them ("[a, b]" for more than one distinct error).
//
// What the kubelet does and this package does not: nothing of the
// computation; the kubelet fetches the node's allocatable resources itself
// for every resourceFieldRef item (and fails the item with "error
// retrieving node: ..."), which the caller does here (NeedsNodeAllocatable).
package downward

import (
	"errors"
	"path"

	v1 "k8s.io/api/core/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/nodevol/nodevol/internal/atomicwriter"
)

// errNoDefaultMode is the kubelet's error for a source whose defaultMode
// the API server did not default.
var errNoDefaultMode = errors.New("no defaultMode used, not even the default value for it")

// Source is a downwardAPI volume source, or a projected volume's
// downwardAPI source with the projected volume's defaults.
type Source struct {
	// Items are the files to write.
	Items []v1.DownwardAPIVolumeFile
	// DefaultMode is the mode of a file whose item has none. Required (the
	// API server defaults it to 0644, and the plugins default a pod built
	// in Go alike): nil is the kubelet's error.
	DefaultMode *int32
	// DefaultUser is the owner of a file whose item has none, with
	// UserFields.
	DefaultUser *int64
	// UserFields turns on the user fields (defaultUser, items[].user) of
	// the AtomicWriteVolumeUserFields feature (alpha in 1.37, off by
	// default): without it they are ignored, as the kubelet ignores them.
	UserFields bool
}

// Payload returns the files of src for pod, keyed by their cleaned paths,
// as the kubelet writes them. nodeAllocatable is the node's allocatable
// resources (node.status.allocatable): the limit of cpu, memory or
// ephemeral-storage of a container that declares none; nil when unknown
// (such a limit then reads 0). An item that cannot be computed is an error
// with the kubelet's text; every item's error is reported, and no payload
// is returned with one.
func Payload(pod *v1.Pod, src Source, nodeAllocatable v1.ResourceList) (map[string]atomicwriter.File, error) {
	if src.DefaultMode == nil {
		return nil, errNoDefaultMode
	}
	if pod == nil {
		return nil, errors.New("no pod to read the downward API from")
	}
	var errs []error
	payload := make(map[string]atomicwriter.File, len(src.Items))
	for i := range src.Items {
		item := &src.Items[i]
		f := atomicwriter.File{Mode: *src.DefaultMode, FSUser: atomicwriter.FileUser(src.UserFields, nil, src.DefaultUser, item.User)}
		if item.Mode != nil {
			f.Mode = *item.Mode
		}
		var (
			value string
			err   error
		)
		switch {
		case item.FieldRef != nil:
			value, err = fieldValue(pod, item.FieldRef.FieldPath)
		case item.ResourceFieldRef != nil:
			value, err = resourceValue(pod, item.ResourceFieldRef, nodeAllocatable)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.Data = []byte(value)
		payload[path.Clean(item.Path)] = f
	}
	if err := utilerrors.NewAggregate(errs); err != nil {
		return nil, err
	}
	return payload, nil
}

// NeedsNodeAllocatable reports whether items read a container's resources,
// whose undeclared limits are the node's allocatable ones: the kubelet
// reads the node for them (and only for them).
func NeedsNodeAllocatable(items []v1.DownwardAPIVolumeFile) bool {
	for i := range items {
		if items[i].ResourceFieldRef != nil && items[i].FieldRef == nil {
			return true
		}
	}
	return false
}
