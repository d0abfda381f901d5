package reconciler

import (
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// Inbox is how the rest of the world talks to the loop: the node agent's
// pod calls, informer handlers, driver registrations and the volumes-in-use
// reporter post here from their own goroutines, never blocking, and kick
// the loop (Kick). The loop takes everything at once (take), so what was posted
// before a call is seen together with it: pods added before
// MarkPodsSynced are in the same batch as the mark, or an earlier one.
type Inbox struct {
	kick chan struct{}

	mu sync.Mutex
	// pods are the pods the node agent has added and not deleted, as much
	// of them as the loop reads (resolve.Keep).
	pods map[types.UID]*resolve.KeptPod
	// dirtyPods were added, updated or deleted since the last take.
	dirtyPods map[types.UID]struct{}
	posted
}

// posted is what the inbox collects between takes besides the pods, and
// what a batch hands over of it.
type posted struct {
	// podsSynced: MarkPodsSynced was called.
	podsSynced bool
	// informersSynced: the informers have listed everything once.
	informersSynced bool
	// claims are "namespace/name" of claims whose PVC or PV changed.
	claims map[string]struct{}
	// volumes are to be retried at once, their backoff forgotten.
	volumes map[podvol.UniqueVolumeName]struct{}
	// drivers registered, went or had their CSIDriver change.
	drivers map[string]struct{}
	// attachments are the names of VolumeAttachments of this node that changed.
	attachments map[string]struct{}
	// objects are the held API objects that changed (the object cache's
	// OnChange): the volumes that read them are published again.
	objects map[objectcache.Ref]struct{}
	// credentials are the pods whose pod certificate was issued, renewed,
	// denied or failed: their projected volumes are published again.
	credentials map[types.UID]struct{}
	// node: this node's labels or allocatable resources changed (or its
	// Node arrived): the pods are resolved again.
	node bool
	// plugins are volume plugins registered, replaced or removed at run
	// time (flexVolume drivers): the pods are resolved again and the
	// plugins' volumes tried again at once.
	plugins map[string]struct{}
}

// NewInbox returns an empty inbox.
func NewInbox() *Inbox {
	return &Inbox{
		kick:      make(chan struct{}, 1),
		pods:      map[types.UID]*resolve.KeptPod{},
		dirtyPods: map[types.UID]struct{}{},
		posted: posted{
			claims:      map[string]struct{}{},
			volumes:     map[podvol.UniqueVolumeName]struct{}{},
			drivers:     map[string]struct{}{},
			attachments: map[string]struct{}{},
			objects:     map[objectcache.Ref]struct{}{},
			credentials: map[types.UID]struct{}{},
			plugins:     map[string]struct{}{},
		},
	}
}

// batch is what the loop takes from the inbox at once: the dirty pods (a
// nil value: deleted) and what else was posted (nil maps when empty).
type batch struct {
	pods map[types.UID]*v1.Pod
	posted
}

func (in *Inbox) wake() {
	select {
	case in.kick <- struct{}{}:
	default:
	}
}

// Kick returns the channel the inbox signals when it holds something:
// the run loop then calls Process.
func (in *Inbox) Kick() <-chan struct{} { return in.kick }

// post runs fn under the inbox's lock and kicks the loop.
func (in *Inbox) post(fn func()) {
	in.mu.Lock()
	fn()
	in.mu.Unlock()
	in.wake()
}

// AddPod posts pod. hold, if set, runs under the inbox's lock with it:
// what it holds for the pod is then never let go by a release for an
// earlier delete of the pod (IfGone).
func (in *Inbox) AddPod(pod *resolve.KeptPod, hold func()) {
	in.post(func() {
		in.pods[pod.UID()] = pod
		in.dirtyPods[pod.UID()] = struct{}{}
		if hold != nil {
			hold()
		}
	})
}

// IfGone runs fn under the inbox's lock if pod uid is not added (deleted,
// or never added).
func (in *Inbox) IfGone(uid types.UID, fn func()) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.pods[uid]; !ok {
		fn()
	}
}

// DeletePod posts that pod uid is gone.
func (in *Inbox) DeletePod(uid types.UID) {
	in.post(func() {
		delete(in.pods, uid)
		in.dirtyPods[uid] = struct{}{}
	})
}

// Knows reports whether pod uid is added and not deleted.
func (in *Inbox) Knows(uid types.UID) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	_, ok := in.pods[uid]
	return ok
}

// PodsWithVolumes returns, sorted, the pods added and not deleted that
// have a volume one of plugins handles ("namespace/name").
func (in *Inbox) PodsWithVolumes(plugins *volume.Registry) []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []string
	for _, k := range in.pods {
		if len(resolve.PodVolumes(k.Pod(), plugins)) > 0 {
			out = append(out, k.Name())
		}
	}
	sort.Strings(out)
	return out
}

// MarkPodsSynced posts that every pod running on the node has been added.
func (in *Inbox) MarkPodsSynced() { in.post(func() { in.podsSynced = true }) }

// MarkInformersSynced posts that the informers have listed once.
func (in *Inbox) MarkInformersSynced() { in.post(func() { in.informersSynced = true }) }

// Claim posts that claim key ("namespace/name") changed.
func (in *Inbox) Claim(key string) { in.post(func() { in.claims[key] = struct{}{} }) }

// Driver posts that a CSI driver registered, or its CSIDriver changed.
func (in *Inbox) Driver(name string) { in.post(func() { in.drivers[name] = struct{}{} }) }

// NodeChanged posts that the node's Node changed.
func (in *Inbox) NodeChanged() { in.post(func() { in.node = true }) }

// PluginsChanged posts that the plugins of names came or went (flexVolume
// drivers): their volumes are tried again at once.
func (in *Inbox) PluginsChanged(names ...string) {
	in.post(func() {
		for _, n := range names {
			in.plugins[n] = struct{}{}
		}
	})
}

// CredentialsChanged posts that pod uid's credentials changed (its pod
// certificates): its volumes that read them are republished.
func (in *Inbox) CredentialsChanged(uid types.UID) {
	in.post(func() { in.credentials[uid] = struct{}{} })
}

// ObjectChanged is the object cache's OnChange. A claim or an attachment
// (read through the cache unless Config.ClusterInformers) is posted as its
// informer's event would be; a
// volume and the objects of configMap, secret and projected volumes go
// to their holders.
func (in *Inbox) ObjectChanged(r objectcache.Ref) {
	switch r.Kind {
	case objectcache.PersistentVolumeClaim:
		in.Claim(r.Namespace + "/" + r.Name)
	case objectcache.VolumeAttachment:
		in.Attachment(r.Name)
	default:
		in.post(func() { in.objects[r] = struct{}{} })
	}
}

// Attachment posts that VolumeAttachment name changed.
func (in *Inbox) Attachment(name string) {
	in.post(func() { in.attachments[name] = struct{}{} })
}

// Retry posts that the world changed for volumes names (reported in
// use): they are planned again, their backoff may be forgotten.
func (in *Inbox) Retry(names ...podvol.UniqueVolumeName) {
	if len(names) == 0 {
		return
	}
	in.post(func() {
		for _, n := range names {
			in.volumes[n] = struct{}{}
		}
	})
}

// take returns everything posted since the last take. The batch's maps
// are the loop's from then on: the inbox starts new ones.
func (in *Inbox) take() batch {
	in.mu.Lock()
	defer in.mu.Unlock()
	b := batch{posted: posted{podsSynced: in.podsSynced, informersSynced: in.informersSynced}}
	if len(in.dirtyPods) > 0 {
		b.pods = make(map[types.UID]*v1.Pod, len(in.dirtyPods))
		for uid := range in.dirtyPods {
			b.pods[uid] = in.pods[uid].Pod()
		}
		in.dirtyPods = map[types.UID]struct{}{}
	}
	b.claims, in.claims = swap(in.claims)
	b.volumes, in.volumes = swap(in.volumes)
	b.drivers, in.drivers = swap(in.drivers)
	b.attachments, in.attachments = swap(in.attachments)
	b.objects, in.objects = swap(in.objects)
	b.credentials, in.credentials = swap(in.credentials)
	b.plugins, in.plugins = swap(in.plugins)
	b.node, in.node = in.node, false
	return b
}

// swap hands m over (nil when empty) and returns the map to use next.
func swap[K comparable](m map[K]struct{}) (taken, next map[K]struct{}) {
	if len(m) == 0 {
		return nil, m
	}
	return m, map[K]struct{}{}
}

// pluginOf reports whether volume n belongs to one of plugins, registered
// or gone (volume.OfPlugin).
func pluginOf(n podvol.UniqueVolumeName, plugins map[string]struct{}) bool {
	for p := range plugins {
		if volume.OfPlugin(n, p) {
			return true
		}
	}
	return false
}
