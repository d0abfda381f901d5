package volume

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
)

// Registry maps a pod volume's source, and a volume's unique name, to the
// one plugin that handles it. Plugins are registered by name; an embedder
// may register its own. It is safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	plugins map[string]Plugin
	// names are the plugins' names, sorted, so that lookups and their
	// errors do not depend on map order.
	names []string
}

// NewRegistry returns a registry holding plugins (see Register).
func NewRegistry(plugins ...Plugin) (*Registry, error) {
	r := &Registry{plugins: map[string]Plugin{}}
	for _, p := range plugins {
		if err := r.Register(p); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Register adds p. Its name must be set and must not be taken; nor may it
// be a prefix, up to a slash, of another plugin's name or the other way
// round (as "example.com/x" and "example.com/x/y"), since a volume's
// unique name must start with exactly one plugin's name.
func (r *Registry) Register(p Plugin) error {
	if p == nil {
		return errors.New("registering a volume plugin: nil plugin")
	}
	name := p.Name()
	if name == "" {
		return fmt.Errorf("registering volume plugin %T: empty name", p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.names {
		if n == name || strings.HasPrefix(name, n+"/") || strings.HasPrefix(n, name+"/") {
			return fmt.Errorf("registering volume plugin %s (%T): its name clashes with plugin %s (%T)", name, p, n, r.plugins[n])
		}
	}
	r.plugins[name] = p
	r.names = append(r.names, name)
	slices.Sort(r.names)
	return nil
}

// Replace registers p in place of the plugin of the same name, or as
// Register does when there is none: a plugin found at run time (a
// flexVolume driver initialised again) takes over that name's volumes at
// once, with no moment when none handles them. Its name must not clash
// with another's (see Register).
func (r *Registry) Replace(p Plugin) error {
	if p == nil {
		return errors.New("registering a volume plugin: nil plugin")
	}
	r.mu.Lock()
	if _, ok := r.plugins[p.Name()]; ok {
		r.plugins[p.Name()] = p
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	return r.Register(p)
}

// Unregister removes the plugin named name, if registered (a flexVolume
// driver removed at run time); its volumes then have no plugin
// (ErrNoPlugin) until one of that name is registered again.
func (r *Registry) Unregister(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.plugins[name]; !ok {
		return
	}
	delete(r.plugins, name)
	r.names = slices.DeleteFunc(r.names, func(n string) bool { return n == name })
}

// ForSource returns the plugin that handles the pod volume v. It is an
// error, naming the volume and its kind, when no plugin handles it
// (wrapping ErrNoPlugin, and naming what replaces the kind when it is one
// nodevol leaves out: ReplacedBy) or when more than one claims it.
func (r *Registry) ForSource(v *v1.Volume) (Plugin, error) {
	if v == nil {
		return nil, errors.New("looking up the plugin of a pod volume: nil volume")
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var match []string
	for _, n := range r.names {
		if r.plugins[n].CanSupport(v) {
			match = append(match, n)
		}
	}
	switch len(match) {
	case 0:
		kind := SourceKind(&v.VolumeSource)
		return nil, fmt.Errorf("volume %q of kind %s: %w (registered: %s)%s", v.Name, kind, ErrNoPlugin, r.list(), hint(kind))
	case 1:
		return r.plugins[match[0]], nil
	}
	return nil, fmt.Errorf("volume %q of kind %s: claimed by more than one volume plugin (%s)", v.Name, SourceKind(&v.VolumeSource), strings.Join(match, ", "))
}

// ForVolume returns the plugin of the volume named name: the one whose
// name, followed by a slash, starts it. It is an error wrapping
// ErrNoPlugin when none does.
func (r *Registry) ForVolume(name podvol.UniqueVolumeName) (Plugin, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, n := range r.names {
		if OfPlugin(name, n) {
			return r.plugins[n], nil
		}
	}
	return nil, fmt.Errorf("volume %s: %w (registered: %s)", name, ErrNoPlugin, r.list())
}

// OfPlugin reports whether the volume named name is one of the plugin
// named plugin's: the plugin's name, followed by a slash, starts it, as
// ForVolume finds a volume's plugin. It holds whether or not that plugin
// is registered now (a flexVolume driver that went away still names its
// volumes).
func OfPlugin(name podvol.UniqueVolumeName, plugin string) bool {
	// The plugin's name and a slash, without building plugin+"/": this
	// runs for every plan and every operation.
	s := string(name)
	return len(s) > len(plugin) && s[len(plugin)] == '/' && strings.HasPrefix(s, plugin)
}

// list is the registered names for messages; the caller holds mu.
func (r *Registry) list() string {
	if len(r.names) == 0 {
		return "none"
	}
	return strings.Join(r.names, ", ")
}

// SourceKind names the kind of a pod volume's source as the pod spec
// spells it ("persistentVolumeClaim", "emptyDir", "image", ...), for
// messages; "no source" when none is set.
func SourceKind(src *v1.VolumeSource) string { return kindOf(src) }

// kindOf names the one source set in *src, a struct of optional source
// pointers (v1.VolumeSource, v1.PersistentVolumeSource), by its JSON name.
func kindOf(src any) string {
	s := reflect.ValueOf(src).Elem()
	for i := range s.NumField() {
		if f := s.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			tag, _, _ := strings.Cut(s.Type().Field(i).Tag.Get("json"), ",")
			return tag
		}
	}
	return "no source"
}

// SharesKind reports whether plugins a and b claim a kind of source in
// common, judged as CheckSources judges (an empty source of each kind of
// pod volume, and for PVPlugins of each kind of PV), or have the same
// name: an embedder's plugin for a kind replaces a default one.
func SharesKind(a, b Plugin) bool {
	if a.Name() == b.Name() {
		return true
	}
	for _, v := range emptySources() {
		if a.CanSupport(v) && b.CanSupport(v) {
			return true
		}
	}
	pa, okA := a.(PVPlugin)
	pb, okB := b.(PVPlugin)
	if !okA || !okB {
		return false
	}
	t := reflect.TypeFor[v1.PersistentVolumeSource]()
	for i := range t.NumField() {
		if f := t.Field(i); f.Type.Kind() == reflect.Pointer {
			pv := &v1.PersistentVolume{}
			reflect.ValueOf(&pv.Spec.PersistentVolumeSource).Elem().Field(i).Set(reflect.New(f.Type.Elem()))
			if pa.CanSupportPV(pv) && pb.CanSupportPV(pv) {
				return true
			}
		}
	}
	return false
}

// emptySources returns a pod volume with an empty source of each kind.
func emptySources() []*v1.Volume {
	t := reflect.TypeFor[v1.VolumeSource]()
	var out []*v1.Volume
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Pointer {
			continue
		}
		v := &v1.Volume{Name: "check"}
		reflect.ValueOf(&v.VolumeSource).Elem().Field(i).Set(reflect.New(f.Type.Elem()))
		out = append(out, v)
	}
	return out
}

// CheckSources returns an error naming the kind and the plugins when two
// registered plugins claim the same kind of pod volume source, judged on
// an empty source of each kind (CanSupport): such a pod volume could only
// fail to resolve. A plugin that claims a volume by what its source holds
// (a driver name, a server) is judged again at each ForSource.
func (r *Registry) CheckSources() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, v := range emptySources() {
		var match []string
		for _, n := range r.names {
			if r.plugins[n].CanSupport(v) {
				match = append(match, n)
			}
		}
		if len(match) > 1 {
			return fmt.Errorf("pod volumes of kind %s are claimed by more than one volume plugin (%s)", SourceKind(&v.VolumeSource), strings.Join(match, ", "))
		}
	}
	return nil
}
