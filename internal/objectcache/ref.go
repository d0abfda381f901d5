package objectcache

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// Ref names what a holder reads: one object (Name set), or the objects of
// a kind that a selector matches (Name empty). Namespace is empty for a
// cluster-scoped kind. A Ref is a value (comparable): the cache keeps one
// entry per distinct Ref, however many holders hold it.
type Ref struct {
	Kind      Kind
	Namespace string
	Name      string
	// Fields is a field selector (fields.Selector's String form, as
	// "spec.signerName=example.com/foo") on the fields the kind allows;
	// Labels a label selector (labels.Selector's String form). Only for
	// a selecting Ref (Name empty); both empty select every object of
	// the kind (in Namespace).
	Fields, Labels string
}

// String names the ref in errors and logs: kind namespace/name, or the
// kind and its selectors.
func (r Ref) String() string {
	where := r.Name
	if r.Namespace != "" {
		where = r.Namespace + "/" + r.Name
	}
	if r.Name != "" {
		return fmt.Sprintf("%s %s", r.Kind, where)
	}
	return fmt.Sprintf("%s %s{fields %q, labels %q}", r.Kind, where, r.Fields, r.Labels)
}

// errInvalidRef is wrapped by every error of a Ref the cache cannot read.
var errInvalidRef = errors.New("invalid reference")

// matcher is a parsed Ref: which objects of its kind it holds.
type matcher struct {
	name   string
	fields fields.Selector // nil for a named ref
	labels labels.Selector // nil for a named ref
}

// parse checks a Ref against its kind and returns its kind and matcher.
func parse(r Ref) (kindInfo, matcher, error) {
	k, ok := kinds[r.Kind]
	if !ok {
		return kindInfo{}, matcher{}, fmt.Errorf("%w: unknown kind %q", errInvalidRef, r.Kind)
	}
	switch {
	case k.namespaced && r.Namespace == "":
		return k, matcher{}, fmt.Errorf("%w: %s is namespaced, the reference has no namespace", errInvalidRef, r.Kind)
	case !k.namespaced && r.Namespace != "":
		return k, matcher{}, fmt.Errorf("%w: %s is cluster-scoped, the reference has namespace %q", errInvalidRef, r.Kind, r.Namespace)
	case r.Name == "" && k.getOnly:
		return k, matcher{}, fmt.Errorf("%w: %s may only be read by name (the node may GET it, not list it)", errInvalidRef, r.Kind)
	case r.Name != "" && (r.Fields != "" || r.Labels != ""):
		return k, matcher{}, fmt.Errorf("%w: a reference names an object or selects objects, not both", errInvalidRef)
	case r.Name != "":
		return k, matcher{name: r.Name}, nil
	}
	fs, err := fields.ParseSelector(r.Fields)
	if err != nil {
		return k, matcher{}, fmt.Errorf("%w: field selector: %w", errInvalidRef, err)
	}
	var allowed fields.Set
	if k.fields != nil {
		allowed = k.fields(nil)
	}
	for _, req := range fs.Requirements() {
		if _, ok := allowed[req.Field]; !ok {
			return k, matcher{}, fmt.Errorf("%w: %s cannot be selected on field %q", errInvalidRef, r.Kind, req.Field)
		}
	}
	ls, err := labels.Parse(r.Labels)
	if err != nil {
		return k, matcher{}, fmt.Errorf("%w: label selector: %w", errInvalidRef, err)
	}
	return k, matcher{fields: fs, labels: ls}, nil
}

// listOptions are the options of the ref's list and watch: the API server
// sends only what the ref holds.
func (m matcher) listOptions(r Ref) metav1.ListOptions {
	if m.name != "" {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", m.name).String()}
	}
	return metav1.ListOptions{FieldSelector: r.Fields, LabelSelector: r.Labels}
}

// matches reports whether the ref holds obj. The API server filters
// already; this keeps the cache right where a server (or the fake
// clientset, which ignores field selectors) sends more.
func (m matcher) matches(k kindInfo, obj runtime.Object) bool {
	o, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	if m.name != "" {
		return o.GetName() == m.name
	}
	if !m.labels.Matches(labels.Set(o.GetLabels())) {
		return false
	}
	if m.fields.Empty() {
		return true
	}
	var set fields.Set
	if k.fields != nil {
		set = k.fields(obj)
	}
	return m.fields.Matches(set)
}
