package adapter

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
)

// populatePeriod is how often the pod manager is read, as the kubelet's
// desired state of world populator reads it. Pods usually arrive sooner,
// through WaitForAttachAndMount (a pod worker's sync) and WaitForUnmount
// (its termination); the period catches the rest: pods that changed, and
// pods gone without a termination (orphans found after a restart).
const populatePeriod = 100 * time.Millisecond

// podIntake is what the populator tells nodevol.
type podIntake interface {
	AddPod(pod *v1.Pod) error
	UpdatePod(pod *v1.Pod) error
	DeletePod(pod *v1.Pod)
	MarkPodsSynced()
}

// populator feeds nodevol the pods of the kubelet's pod manager, with the
// kubelet's rules (pkg/kubelet/volumemanager/populator): a pod is added
// unless its containers are terminating (before the sources are ready:
// unless its runtime may be removed, so that volumes of pods still
// running after a restart are kept), and removed once its runtime may be
// removed (every container stopped), whether the pod manager still has it
// or not.
type populator struct {
	vm    podIntake
	pods  volumemanager.PodManager
	state volumemanager.PodStateProvider

	mu sync.Mutex
	// known holds each pod given to nodevol, as last given: a pod manager
	// replaces a changed pod's object, so another pointer is an update.
	known map[types.UID]*v1.Pod
	// refused holds the pods nodevol refused (bound to another node), as
	// last given: each is logged once and given again only when it changes.
	refused map[types.UID]*v1.Pod
	synced  bool
}

func newPopulator(vm podIntake, pods volumemanager.PodManager, state volumemanager.PodStateProvider) *populator {
	return &populator{vm: vm, pods: pods, state: state, known: map[types.UID]*v1.Pod{}, refused: map[types.UID]*v1.Pod{}}
}

// run reads the pod manager every populatePeriod until ctx ends. The
// first pass after every source is ready is followed by MarkPodsSynced.
func (p *populator) run(ctx context.Context, sourcesReady config.SourcesReady) {
	logger := klog.FromContext(ctx)
	wait.UntilWithContext(ctx, func(context.Context) {
		ready := !p.isSynced() && sourcesReady.AllReady()
		p.pass(logger)
		if ready {
			p.mu.Lock()
			p.synced = true
			p.mu.Unlock()
			p.vm.MarkPodsSynced()
			logger.V(2).Info("Every pod source is ready: volumes no pod wants may be torn down")
		}
	}, populatePeriod)
}

func (p *populator) isSynced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.synced
}

// pass adds the pod manager's new and changed pods and removes those whose
// runtime may be removed.
func (p *populator) pass(logger klog.Logger) {
	for _, pod := range p.pods.GetPods() {
		p.mu.Lock()
		terminating := p.synced && p.state.ShouldPodContainersBeTerminating(pod.UID)
		p.mu.Unlock()
		if !terminating {
			p.add(logger, pod)
		}
	}
	p.mu.Lock()
	uids := make([]types.UID, 0, len(p.known)+len(p.refused))
	for uid := range p.known {
		uids = append(uids, uid)
	}
	for uid := range p.refused {
		uids = append(uids, uid)
	}
	p.mu.Unlock()
	for _, uid := range uids {
		p.removeIfGone(uid)
	}
}

// add gives nodevol a pod it does not have, or the pod's new object.
// Before the sources are ready, a pod whose runtime may be removed is not
// added: it is on its way out.
func (p *populator) add(logger klog.Logger, pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, found := p.known[pod.UID]
	switch {
	case found && last == pod, p.refused[pod.UID] == pod:
		return
	case !found && !p.synced && p.state.ShouldPodRuntimeBeRemoved(pod.UID):
		return
	}
	var err error
	if found {
		err = p.vm.UpdatePod(pod)
	} else {
		err = p.vm.AddPod(pod)
	}
	if err != nil {
		logger.Error(err, "nodevol refused the pod's volumes", "pod", klog.KObj(pod), "podUID", pod.UID)
		p.refused[pod.UID] = pod
		return
	}
	delete(p.refused, pod.UID)
	p.known[pod.UID] = pod
}

// removeIfGone removes the pod from nodevol's desired state once its
// runtime may be removed: its volumes are then unmounted.
func (p *populator) removeIfGone(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.state.ShouldPodRuntimeBeRemoved(uid) {
		return
	}
	delete(p.refused, uid)
	pod, found := p.known[uid]
	if !found {
		return
	}
	p.vm.DeletePod(pod)
	delete(p.known, uid)
}
