package resolve

import (
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// resourceLists shares equal resource lists among the claims and volumes
// the informers keep: a claim's spec.resources.requests and
// status.capacity and a volume's spec.capacity are each a map of about
// 600 bytes (a Go map has room for 8 entries from its first), mostly
// holding the same few sizes across a cluster ("10Gi"). Informer objects
// are read-only to everyone who reads them (nodevol deep-copies before it
// changes a claim), so one map can stand for all the equal ones.
var resourceLists = listInterner{max: maxInternedLists}

// maxInternedLists bounds the table: a list that is not in it once it is
// full is kept as it is (not shared), so a cluster of many distinct sizes
// costs at most this many lists more than it would without sharing.
const maxInternedLists = 1024

// listInterner is a table of resource lists by their content.
type listInterner struct {
	mu    sync.Mutex
	max   int
	lists map[string]v1.ResourceList
}

// intern returns the table's list equal to l (the same names, and
// quantities of the same text and format), adding l when there is none.
// Empty and nil lists are returned as they are.
func (in *listInterner) intern(l v1.ResourceList) v1.ResourceList {
	if len(l) == 0 {
		return l
	}
	key := listKey(l)
	in.mu.Lock()
	defer in.mu.Unlock()
	if shared, ok := in.lists[key]; ok {
		return shared
	}
	if len(in.lists) >= in.max {
		return l
	}
	if in.lists == nil {
		in.lists = map[string]v1.ResourceList{}
	}
	in.lists[key] = l
	return l
}

// listKey is l's content as text: each name with its quantity's text and
// format, sorted by name. Two quantities of the same text and format read
// the same through every method of resource.Quantity.
func listKey(l v1.ResourceList) string {
	names := make([]string, 0, len(l))
	for name := range l {
		names = append(names, string(name))
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		q := l[v1.ResourceName(name)]
		b.WriteString(name)
		b.WriteByte(0)
		b.WriteString(q.String())
		b.WriteByte(0)
		b.WriteString(string(q.Format))
		b.WriteByte(0)
	}
	return b.String()
}
