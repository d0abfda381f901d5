package resolve

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/podvol"
)

// errNoNode says the node's own Node object is not known (yet): a PV's
// node affinity or an emptyDir's memory bound cannot be judged. Not
// final: the pod volume is resolved again when the Node arrives.
var errNoNode = errors.New("this node's Node object is not known yet")

// errNodeMissing is wrapped, with errNoNode, by the error of a Node the
// informer has synced without finding: none exists (a test's fake API
// server, a node not registered). The kubelet then falls back to the node
// it builds from the machine (getNodeAnyWay); a memory bound falls back to
// the machine's memory the same way (AllocatableMemory).
var errNodeMissing = errors.New("no Node object of this name exists")

// errNodeNotListed is wrapped, with errNoNode, while the Node informer has
// not made its first list: a wait of the start, like the other informers'
// (waitForListers), which the Resolver logs without an error.
var errNodeNotListed = errors.New("the Node informer has not listed yet")

// NodeInformer is the default Config.Node: an informer on this node's own
// Node object alone (a field selector on its name, as the kubelet's), which
// a node's own credentials may list and watch, and the function that reads
// the Node from it. A change of its labels or allocatable resources calls
// changed (the pods are resolved again); the volumes its
// status.volumesAttached lists anew are given to attached.
func NodeInformer(client kubernetes.Interface, nodeName string, changed func(), attached func(...podvol.UniqueVolumeName)) (informers.SharedInformerFactory, func() (*v1.Node, error), error) {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}),
		informers.WithTransform(trimNode))
	nodes := f.Core().V1().Nodes()
	// Not among the informers pod resolution waits for: a pod needs the
	// Node only for a PV with node affinity or a Memory emptyDir, and
	// those wait for it alone (errNoNode), resolved again when it comes.
	_, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			changed()
			attached(newlyAttached(nil, obj.(*v1.Node))...)
		},
		UpdateFunc: func(old, obj any) {
			o, n := old.(*v1.Node), obj.(*v1.Node)
			if !equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Status.Allocatable, n.Status.Allocatable) {
				changed()
			}
			attached(newlyAttached(o, n)...)
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("adding the Node informer's handler: %w", err)
	}
	lister, informer := nodes.Lister(), nodes.Informer()
	return f, func() (*v1.Node, error) {
		n, err := lister.Get(nodeName)
		switch {
		case err == nil:
			return n, nil
		case apierrors.IsNotFound(err) && informer.HasSynced():
			return nil, fmt.Errorf("%w: %w: %w", errNoNode, errNodeMissing, err)
		case informer.HasSynced():
			return nil, fmt.Errorf("%w: %w", errNoNode, err)
		}
		return nil, fmt.Errorf("%w: %w: %w", errNoNode, errNodeNotListed, err)
	}, nil
}

// newlyAttached returns the volumes n's status.volumesAttached lists and
// old's (nil: none) did not: a volume of a plugin that waits for the
// attach/detach controller's word there (a flexVolume driver that
// attaches) is tried again at once, not when its backoff ends.
func newlyAttached(old, n *v1.Node) []podvol.UniqueVolumeName {
	had := map[v1.UniqueVolumeName]bool{}
	if old != nil {
		for _, av := range old.Status.VolumesAttached {
			had[av.Name] = true
		}
	}
	var out []podvol.UniqueVolumeName
	for _, av := range n.Status.VolumesAttached {
		if !had[av.Name] {
			out = append(out, podvol.UniqueVolumeName(av.Name))
		}
	}
	return out
}

// trimNode keeps of a Node what pod resolution reads (its name, labels and
// allocatable resources) and the volumes the attach/detach controller
// lists as attached (what a flexVolume's attach waits for): the rest
// (images, conditions, managed fields) changes all the time and would
// only be kept in memory.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*v1.Node)
	if !ok {
		return obj, nil
	}
	out := &v1.Node{}
	out.Name, out.UID, out.ResourceVersion, out.Labels = n.Name, n.UID, n.ResourceVersion, n.Labels
	out.Status.Allocatable, out.Status.VolumesAttached = n.Status.Allocatable, n.Status.VolumesAttached
	return out, nil
}

// checkNodeAffinity refuses a PV whose required node affinity this node
// does not match, as the kubelet checks every PV before mounting it: the
// terms are ORed, the expressions and fields of a term ANDed; a term
// with neither matches nothing.
func checkNodeAffinity(pv *v1.PersistentVolume, node *v1.Node) error {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil
	}
	set := labels.Set(node.Labels)
	fieldSet := labels.Set{"metadata.name": node.Name}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		ok, err := matchTerm(term, set, fieldSet)
		if err != nil {
			return fmt.Errorf("PV %s: node affinity: %w", pv.Name, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("PV %s: node affinity: no matching NodeSelectorTerms for node %s (the volume is on another node)", pv.Name, node.Name)
}

// matchTerm reports whether one node selector term matches.
func matchTerm(term v1.NodeSelectorTerm, set, fieldSet labels.Set) (bool, error) {
	if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
		return false, nil
	}
	for _, group := range []struct {
		reqs []v1.NodeSelectorRequirement
		set  labels.Set
	}{{term.MatchExpressions, set}, {term.MatchFields, fieldSet}} {
		for _, r := range group.reqs {
			op, ok := selectorOps[r.Operator]
			if !ok {
				return false, fmt.Errorf("unknown operator %q for key %q", r.Operator, r.Key)
			}
			req, err := labels.NewRequirement(r.Key, op, r.Values)
			if err != nil {
				return false, fmt.Errorf("key %q: %w", r.Key, err)
			}
			if !req.Matches(group.set) {
				return false, nil
			}
		}
	}
	return true, nil
}

// selectorOps maps the node selector's operators to the label selector's.
var selectorOps = map[v1.NodeSelectorOperator]selection.Operator{
	v1.NodeSelectorOpIn:           selection.In,
	v1.NodeSelectorOpNotIn:        selection.NotIn,
	v1.NodeSelectorOpExists:       selection.Exists,
	v1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	v1.NodeSelectorOpGt:           selection.GreaterThan,
	v1.NodeSelectorOpLt:           selection.LessThan,
}

// NodeAllocatable is the node's allocatable resources: what a downward API
// file shows of a container that sets no limit.
func NodeAllocatable(node func() (*v1.Node, error)) func() (v1.ResourceList, error) {
	return func() (v1.ResourceList, error) {
		n, err := node()
		switch {
		case errors.Is(err, errNodeMissing):
			return machineAllocatable()
		case err != nil:
			return nil, err
		}
		return n.Status.Allocatable, nil
	}
}

// AllocatableMemory is the node's allocatable memory in bytes, the bound of
// an emptyDir of medium Memory.
func AllocatableMemory(node func() (*v1.Node, error)) func() (int64, error) {
	return func() (int64, error) {
		n, err := node()
		switch {
		case errors.Is(err, errNodeMissing):
			return machineMemory()
		case err != nil:
			return 0, err
		}
		q := n.Status.Allocatable[v1.ResourceMemory] // none reported: no bound from the node, as the kubelet
		return q.Value(), nil
	}
}

// machineAllocatable is the cpu and memory of the machine: the allocatable
// resources of the node the kubelet builds from the machine when no Node
// object exists (without its reservations, which nodevol does not know).
func machineAllocatable() (v1.ResourceList, error) {
	mem, err := machineMemory()
	if err != nil {
		return nil, err
	}
	return v1.ResourceList{
		v1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
	}, nil
}

// machineMemory is the machine's memory in bytes: the allocatable memory of
// the node the kubelet builds from the machine when no Node object exists
// (without its reservations, which nodevol does not know).
func machineMemory() (int64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("reading the machine's memory: %w", err)
	}
	return int64(si.Totalram) * int64(si.Unit), nil
}
