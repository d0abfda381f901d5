package kubeletbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	kubeletsubpath "k8s.io/kubernetes/pkg/volume/util/subpath"
	volumetypes "k8s.io/kubernetes/pkg/volume/util/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/subpath"
	"github.com/nodevol/nodevol/volumemanager"
)

// errLog records what a side logs as an error: Error calls, and Info
// calls that carry an error (the kubelet logs a volume it could not
// reconstruct at info level, with the error under "err").
type errLog struct {
	mu    sync.Mutex
	lines []string
	// reconstruction counts the messages, at any level, about
	// reconstruction: none means the log is not the side's.
	reconstruction int
}

func (l *errLog) logger() logr.Logger { return logr.New(&errSink{log: l}) }

func (l *errLog) add(msg string, err error, kv []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%s: %v %v", msg, err, kv))
}

// errors returns what was recorded.
func (l *errLog) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

type errSink struct {
	log    *errLog
	values []any
}

func (s *errSink) Init(logr.RuntimeInfo) {}
func (s *errSink) Enabled(int) bool      { return true }

func (s *errSink) Info(_ int, msg string, kv ...any) {
	if strings.Contains(strings.ToLower(msg), "reconstruct") {
		s.log.mu.Lock()
		s.log.reconstruction++
		s.log.mu.Unlock()
	}
	all := append(slices.Clone(s.values), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		if k, _ := all[i].(string); k == "err" || k == "error" {
			if err, _ := all[i+1].(error); err != nil {
				s.log.add(msg, err, all)
				return
			}
		}
	}
}

func (s *errSink) Error(err error, msg string, kv ...any) {
	s.log.add(msg, err, append(slices.Clone(s.values), kv...))
}

func (s *errSink) WithValues(kv ...any) logr.LogSink {
	return &errSink{log: s.log, values: append(slices.Clone(s.values), kv...)}
}

func (s *errSink) WithName(string) logr.LogSink { return s }

// tokenIssuer answers both sides' TokenRequests on their fake API
// servers: token-1, token-2, ... valid for what was asked.
type tokenIssuer struct {
	mu sync.Mutex
	n  int
}

func (ti *tokenIssuer) react(a k8stesting.Action) (bool, kruntime.Object, error) {
	if a.GetSubresource() != "token" {
		return false, nil, nil
	}
	create, ok := a.(k8stesting.CreateAction)
	if !ok {
		return false, nil, nil
	}
	tr, ok := create.GetObject().(*authenticationv1.TokenRequest)
	if !ok {
		return false, nil, nil
	}
	tr = tr.DeepCopy()
	ti.mu.Lock()
	ti.n++
	n := ti.n
	ti.mu.Unlock()
	seconds := int64(3600)
	if tr.Spec.ExpirationSeconds != nil {
		seconds = *tr.Spec.ExpirationSeconds
	}
	tr.Status = authenticationv1.TokenRequestStatus{Token: fmt.Sprintf("token-%d", n),
		ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Duration(seconds) * time.Second))}
	return true, tr, nil
}

// nodevolVM is nodevol's volume manager in this process, on a fake API
// server of the env's objects: the hand-over tests of every kind drive
// it directly, to change an object after the hand-over and to prepare
// subPaths as a runtime would.
type nodevolVM struct {
	vm     *volumemanager.VolumeManager
	client *fake.Clientset
	cancel context.CancelFunc
	done   chan error
	log    *errLog
}

// startNodevol starts nodevol on the root with the pods wanted: Run, the
// drivers registered, the pods added and MarkPodsSynced, as the example
// agent does once its pod informer has synced.
func (e *hvEnv) startNodevol(wanted []*hvPod) *nodevolVM {
	e.t.Helper()
	o := e.objects(wanted)
	client := fake.NewClientset(append(o.apiObjects(), podObjects(o.Pods)...)...)
	client.PrependReactor("create", "serviceaccounts", e.tokens.react)
	vm, err := volumemanager.New(volumemanager.Config{NodeName: hvNode, KubeClient: client, RootDir: e.root, Mounter: mount.New("")})
	if err != nil {
		e.t.Fatal(err)
	}
	log := &errLog{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), log.logger()))
	n := &nodevolVM{vm: vm, client: client, cancel: cancel, done: make(chan error, 1), log: log}
	go func() { n.done <- vm.Run(ctx) }()
	e.nodevol = n
	for _, d := range e.drivers {
		if err := vm.Drivers().Register(ctx, d.name, d.sock); err != nil {
			e.t.Fatalf("nodevol: registering driver %s: %v", d.name, err)
		}
	}
	for _, p := range wanted {
		if err := vm.AddPod(p.pod); err != nil {
			e.t.Fatalf("nodevol: adding pod %s: %v", p.name, err)
		}
	}
	vm.MarkPodsSynced()
	return n
}

// stopNodevol stops nodevol without tearing anything down, as the agent
// stops on SIGTERM: Run's context cancelled, Run returned.
func (e *hvEnv) stopNodevol() {
	n := e.nodevol
	if n == nil {
		return
	}
	e.nodevol = nil
	n.cancel()
	if err := <-n.done; err != nil && !errors.Is(err, context.Canceled) {
		e.t.Errorf("nodevol: Run: %v", err)
	}
}

// mountPods adds the pods and waits for their volumes.
func (n *nodevolVM) mountPods(t *testing.T, pods ...*hvPod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range pods {
		if err := n.vm.WaitForAttachAndMount(ctx, p.pod); err != nil {
			t.Fatalf("nodevol: pod %s: %v", p.name, err)
		}
	}
}

// deletePods deletes the pods and waits until their volumes are unmounted
// and no volume is in use any more.
func (n *nodevolVM) deletePods(t *testing.T, pods ...*hvPod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range pods {
		n.vm.DeletePod(p.pod)
	}
	for _, p := range pods {
		if err := n.vm.WaitForUnmount(ctx, p.pod); err != nil {
			t.Fatalf("nodevol: pod %s: %v", p.name, err)
		}
	}
	// Every device unstaged: volumesInUse lists only attachable volumes,
	// as the kubelet's, so it cannot tell.
	if err := n.vm.WaitForUnstaged(ctx); err != nil {
		t.Fatalf("nodevol: %v", err)
	}
}

// subPathMount is one volumeMount with a subPath of a pod's container.
type subPathMount struct {
	container string
	index     int
	mount     v1.VolumeMount
}

func subPathMounts(p *hvPod) []subPathMount {
	var out []subPathMount
	for _, c := range p.pod.Spec.Containers {
		for i, m := range c.VolumeMounts {
			if m.SubPath != "" {
				out = append(out, subPathMount{container: c.Name, index: i, mount: m})
			}
		}
	}
	return out
}

// prepareSubPaths makes the pod's subPath bind mounts as the kubelet
// makes them at container start (kubelet_pods.go makeMounts): a missing
// subPath made with the volume's mode (SafeMakeDir), then
// PrepareSafeSubpath. It returns the bind mounts' paths.
func (k *kubeletVM) prepareSubPaths(t *testing.T, e *hvEnv, p *hvPod) []string {
	t.Helper()
	vols := k.vm.GetMountedVolumesForPod(volumetypes.UniquePodName(p.uid()))
	var out []string
	for _, s := range subPathMounts(p) {
		vol, ok := vols[s.mount.Name]
		if !ok {
			t.Fatalf("the kubelet: pod %s: volume %s is not mounted", p.name, s.mount.Name)
		}
		volumePath := vol.Mounter.GetPath()
		hostPath := filepath.Join(volumePath, s.mount.SubPath)
		if _, err := os.Stat(hostPath); os.IsNotExist(err) {
			perm, err := k.host.hostUtil.GetMode(volumePath)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.host.subpather.SafeMakeDir(s.mount.SubPath, volumePath, perm); err != nil {
				t.Fatalf("the kubelet: pod %s: making subPath %s: %v", p.name, s.mount.SubPath, err)
			}
		}
		bind, cleanup, err := k.host.subpather.PrepareSafeSubpath(kubeletsubpath.Subpath{VolumeMountIndex: s.index, Path: hostPath,
			VolumeName: vol.InnerVolumeSpecName, VolumePath: volumePath, PodDir: filepath.Join(e.root, "pods", string(p.uid())), ContainerName: s.container})
		if cleanup != nil {
			cleanup()
		}
		if err != nil {
			t.Fatalf("the kubelet: pod %s: subPath %s: %v", p.name, s.mount.SubPath, err)
		}
		out = append(out, bind)
	}
	return out
}

// prepareSubPaths makes the pod's subPath bind mounts with nodevol's
// subpath.Manager, as a runtime or kubelet fork on nodevol asks it.
func (n *nodevolVM) prepareSubPaths(t *testing.T, p *hvPod) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vols := n.vm.GetMountedVolumesForPod(p.uid())
	var out []string
	for _, s := range subPathMounts(p) {
		i := slices.IndexFunc(vols, func(v podvol.MountedVolume) bool { return v.SpecName == s.mount.Name })
		if i < 0 {
			t.Fatalf("nodevol: pod %s: volume %s is not mounted", p.name, s.mount.Name)
		}
		bind, err := n.vm.SubPaths().Prepare(ctx, subpath.Mount{Pod: p.uid(), Volume: vols[i].DirName, VolumePath: vols[i].Path,
			Container: s.container, Index: s.index, SubPath: s.mount.SubPath})
		if err != nil {
			t.Fatalf("nodevol: pod %s: subPath %s: %v", p.name, s.mount.SubPath, err)
		}
		out = append(out, bind)
	}
	return out
}

// checkLogs fails the test if the side logged an error.
func checkLogs(t *testing.T, side string, l *errLog) {
	t.Helper()
	l.mu.Lock()
	n := l.reconstruction
	l.mu.Unlock()
	if n == 0 {
		t.Errorf("%s logged nothing about reconstruction: its log is not the one checked", side)
	}
	if errs := l.errors(); len(errs) > 0 {
		t.Errorf("%s logged errors:\n  %s", side, strings.Join(errs, "\n  "))
	}
}
