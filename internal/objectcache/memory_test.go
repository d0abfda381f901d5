package objectcache

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestEntryBytes: the memory one watched entry keeps, beyond its object:
// the entry, its loop's goroutine stack (about 4 KiB of it) and context,
// and its holder's bookkeeping (one holder each here). The watches are
// the fake's unbuffered watchers (a real one adds the client's stream
// decoder goroutine and the HTTP/2 stream, which are not measured here).
func TestEntryBytes(t *testing.T) {
	const n = 2000
	limit := 8000.0
	if raceEnabled {
		limit *= 3
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "v"}}
	client := fake.NewClientset()
	var watches atomic.Int32
	client.PrependReactor("list", "configmaps", func(action k8stesting.Action) (bool, apiruntime.Object, error) {
		o := cm.DeepCopy()
		o.Name = action.(k8stesting.ListActionImpl).ListOptions.FieldSelector[len("metadata.name="):]
		return true, &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.ConfigMap{*o}}, nil
	})
	client.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches.Add(1)
		return true, watch.NewFake(), nil
	})
	c, _, _ := runOn(t, Config{Client: client})
	objBytes := objectBytes(cm)
	before := liveBytes()
	holdAndGet(t, c, n)
	eventually(t, "every watch", func() bool { return watches.Load() == n })
	client.ClearActions() // the fake's record of calls is not the cache's
	after := liveBytes()
	per := float64(after-before)/n - float64(objBytes)
	t.Logf("%.0f bytes per entry beside its object (a small configMap in a list: %d bytes)", per, objBytes)
	if per > limit {
		t.Errorf("%.0f bytes per entry, want at most %.0f", per, limit)
	}
}

// objectBytes is what the cache keeps of one listed object: the list's
// backing array of one item.
func objectBytes(cm *corev1.ConfigMap) uint64 {
	const n = 200
	lists := make([]*corev1.ConfigMapList, n)
	before := liveBytes()
	for i := range lists {
		lists[i] = &corev1.ConfigMapList{Items: []corev1.ConfigMap{*cm.DeepCopy()}}
	}
	after := liveBytes()
	runtime.KeepAlive(lists)
	return (after - before) / n
}

// liveBytes returns the bytes of live heap objects and goroutine stacks
// after a collection.
func liveBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// TestGetEntryBytes: a ModeGet entry that has answered holds no goroutine
// while it waits for its next read (only a timer on the clock), so
// holding many adds no goroutines, and little memory beside the objects:
// the entry, its schedule, its timer and its holder's bookkeeping.
func TestGetEntryBytes(t *testing.T) {
	const n = 2000
	limit := 2000.0
	if raceEnabled {
		limit *= 3
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "v"}}
	client := fake.NewClientset()
	client.PrependReactor("get", "configmaps", func(action k8stesting.Action) (bool, apiruntime.Object, error) {
		o := cm.DeepCopy()
		o.Name = action.(k8stesting.GetActionImpl).Name
		return true, o, nil
	})
	fc := newFakeClock()
	c, _, _ := runOn(t, Config{Client: client, Clock: fc, Mode: ModeGet})
	objBytes := singleObjectBytes(cm)
	goroutines := runtime.NumGoroutine()
	before := liveBytes()
	holdAndGet(t, c, n)
	eventually(t, "every entry waiting for its next read", func() bool { return fc.Waiters() == n })
	client.ClearActions() // the fake's record of calls is not the cache's
	after := liveBytes()
	grown := runtime.NumGoroutine() - goroutines
	per := float64(after-before)/n - float64(objBytes)
	t.Logf("%.0f bytes per get entry beside its object (a small configMap: %d bytes); %d goroutines more for %d entries", per, objBytes, grown, n)
	if grown > 10 {
		t.Errorf("%d goroutines more with %d get entries held and answered, want none (a few at most)", grown, n)
	}
	if per > limit {
		t.Errorf("%.0f bytes per get entry, want at most %.0f", per, limit)
	}
}

// singleObjectBytes is what the cache keeps of one object a GET gave.
func singleObjectBytes(cm *corev1.ConfigMap) uint64 {
	const n = 200
	objs := make([]*corev1.ConfigMap, n)
	before := liveBytes()
	for i := range objs {
		objs[i] = cm.DeepCopy()
	}
	after := liveBytes()
	runtime.KeepAlive(objs)
	return (after - before) / n
}

// holdAndGet has n holders hold a configMap each (cm-00000 on, in
// namespace ns) and waits for each one's first answer.
func holdAndGet(t *testing.T, c *Cache, n int) {
	t.Helper()
	refs := make([]Ref, n)
	for i := range refs {
		refs[i] = Ref{Kind: ConfigMap, Namespace: "ns", Name: fmt.Sprintf("cm-%05d", i)}
		c.Hold(fmt.Sprintf("pod-%05d", i), refs[i])
	}
	for _, r := range refs {
		get(t, c, r)
	}
}
