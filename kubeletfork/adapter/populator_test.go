package adapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/config"
)

// intake records what the populator tells nodevol.
type intake struct {
	mu     sync.Mutex
	calls  []string
	refuse map[types.UID]bool
	synced chan struct{}
}

func newIntake() *intake {
	return &intake{refuse: map[types.UID]bool{}, synced: make(chan struct{})}
}

func (i *intake) record(verb string, pod *v1.Pod) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.calls = append(i.calls, verb+" "+pod.Name)
}

func (i *intake) AddPod(pod *v1.Pod) error {
	i.record("add", pod)
	if i.refuse[pod.UID] {
		return fmt.Errorf("pod %s is bound to another node", pod.Name)
	}
	return nil
}

func (i *intake) UpdatePod(pod *v1.Pod) error {
	i.record("update", pod)
	return nil
}

func (i *intake) DeletePod(pod *v1.Pod) { i.record("delete", pod) }

func (i *intake) MarkPodsSynced() { close(i.synced) }

func (i *intake) take() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := i.calls
	i.calls = nil
	return out
}

func testPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

// TestPopulatorPass checks one pass over the pod manager against the
// kubelet's populator rules, before and after the sources are ready.
func TestPopulatorPass(t *testing.T) {
	changed := testPod("a")
	changed.Labels = map[string]string{"v": "2"}
	for _, tc := range []struct {
		name string
		// synced: the sources were ready before this pass.
		synced bool
		// known are given to nodevol before the pass.
		known []*v1.Pod
		// pods are the pod manager's; terminating and removable name pods
		// in the pod workers' states.
		pods                   []*v1.Pod
		terminating, removable []string
		refuse                 []string
		want                   []string
	}{
		{name: "new pod added", synced: true, pods: []*v1.Pod{testPod("a")}, want: []string{"add a"}},
		{name: "same object: nothing", synced: true, known: []*v1.Pod{testPod("a")}, pods: []*v1.Pod{testPod("a")}},
		{name: "changed object updated", synced: true, known: []*v1.Pod{testPod("a")}, pods: []*v1.Pod{changed}, want: []string{"update a"}},
		{name: "terminating pod not added once synced", synced: true, pods: []*v1.Pod{testPod("a")}, terminating: []string{"a"}},
		{name: "terminating pod added before the sources are ready", pods: []*v1.Pod{testPod("a")}, terminating: []string{"a"}, want: []string{"add a"}},
		{name: "removable pod not added before the sources are ready", pods: []*v1.Pod{testPod("a")}, removable: []string{"a"}},
		{name: "removable pod removed while in the pod manager", synced: true, known: []*v1.Pod{testPod("a")}, pods: []*v1.Pod{testPod("a")}, removable: []string{"a"}, want: []string{"delete a"}},
		{name: "pod gone from the pod manager kept while its containers run", synced: true, known: []*v1.Pod{testPod("a")}, terminating: []string{"a"}},
		{name: "pod gone and removable removed", synced: true, known: []*v1.Pod{testPod("a")}, removable: []string{"a"}, want: []string{"delete a"}},
		{name: "refused pod told once", synced: true, pods: []*v1.Pod{testPod("a")}, refuse: []string{"a"}, want: []string{"add a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newIntake()
			for _, n := range tc.refuse {
				in.refuse[types.UID("uid-"+n)] = true
			}
			kp := newKubeletPods()
			p := newPopulator(in, kp, kp)
			for _, pod := range tc.known {
				p.add(klog.Background(), pod)
				// The pod manager holds the very object given.
				for i, q := range tc.pods {
					if q.UID == pod.UID && q.Labels == nil {
						tc.pods[i] = pod
					}
				}
			}
			p.synced = tc.synced
			for _, pod := range tc.pods {
				kp.pods[pod.UID] = pod
			}
			for _, n := range tc.terminating {
				kp.terminating[types.UID("uid-"+n)] = true
			}
			for _, n := range tc.removable {
				kp.removable[types.UID("uid-"+n)] = true
			}
			in.take()
			p.pass(klog.Background())
			p.pass(klog.Background()) // a second pass repeats nothing
			if got := in.take(); !slices.Equal(got, tc.want) {
				t.Errorf("calls %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPopulatorMarksSynced: nodevol is told the pods are synced only
// after a pass that started with every source ready, and the pods of
// that pass were given first.
func TestPopulatorMarksSynced(t *testing.T) {
	in := newIntake()
	kp := newKubeletPods(testPod("a"))
	p := newPopulator(in, kp, kp)
	var ready sync.Mutex
	sourcesReady := false
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool {
			ready.Lock()
			defer ready.Unlock()
			return sourcesReady
		}))
	}()
	deadline := time.After(30 * time.Second)
	for {
		in.mu.Lock()
		n := len(in.calls)
		in.mu.Unlock()
		if n > 0 {
			break
		}
		select {
		case <-in.synced:
			t.Fatal("MarkPodsSynced before the sources were ready")
		case <-deadline:
			t.Fatal("the pod manager's pod was never added")
		case <-time.After(populatePeriod):
		}
	}
	ready.Lock()
	sourcesReady = true
	ready.Unlock()
	select {
	case <-in.synced:
	case <-deadline:
		t.Fatal("MarkPodsSynced never called once the sources were ready")
	}
	if got := in.take(); !slices.Equal(got, []string{"add a"}) {
		t.Errorf("calls %q, want the pod added once", got)
	}
	cancel()
	<-done
}

// TestWaitForAttachAndMountRefused: a pod nodevol refuses gets its
// error from the wait at once.
func TestWaitForAttachAndMountRefused(t *testing.T) {
	m, err := newManager(options{nodeName: node, podManager: newKubeletPods(), podState: newKubeletPods(),
		client: fakeClient(), mounter: nil, rootDir: t.TempDir(), statsPeriod: time.Minute, mutate: privateRegistry})
	if err != nil {
		t.Fatal(err)
	}
	pod := testPod("elsewhere")
	pod.Spec.NodeName = "node-2"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = m.WaitForAttachAndMount(ctx, pod)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForAttachAndMount = %v, want the refusal at once", err)
	}
}
