package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/volumemanager"
)

// fakeAgentCommand is the hidden subcommand that runs a node agent on a
// fake API server, so that end-to-end tests can run the volume manager as
// a separate process and kill it: there is no real API server to point
// the agent at.
const fakeAgentCommand = "agent-fake"

// fakeObjects is the file agent-fake builds its fake API server from.
type fakeObjects struct {
	CSIDrivers             []storagev1.CSIDriver        `json:"csiDrivers,omitempty"`
	PersistentVolumes      []v1.PersistentVolume        `json:"persistentVolumes,omitempty"`
	PersistentVolumeClaims []v1.PersistentVolumeClaim   `json:"persistentVolumeClaims,omitempty"`
	Pods                   []v1.Pod                     `json:"pods,omitempty"`
	VolumeAttachments      []storagev1.VolumeAttachment `json:"volumeAttachments,omitempty"`
}

// runFakeAgent is agent-fake: a node agent whose pods come from a file
// instead of an informer. It does what runAgent does once its pod
// informer has synced: every pod is added, MarkPodsSynced is called at
// once, and then each pod's volumes are waited for. With --pods-first,
// the volume manager's informers do not sync (and so Run does not
// reconstruct or start its workers) before that: the pod source synced
// first, which makes the order of a restart deterministic. With
// --api-fail, every list and get of PVCs, PVs and VolumeAttachments fails
// from the start (as an API server that is down), until "api-fail off".
// It talks on stdio, one line per message, and reads stdin from the
// start, while it still waits for the file's pods:
//
//	stdout: SYNCED                  every pod of the file added, MarkPodsSynced called
//	        MOUNTED ns/name         the pod's volumes are mounted (pods with volumes only)
//	        READY n                 every pod of the file is mounted or was deleted before; n are mounted
//	        ADDED ns/name           answer to add: AddPod called (MOUNTED follows)
//	        DELETED ns/name         answer to delete: DeletePod called (GONE follows)
//	        GONE ns/name            the deleted pod's volumes are unmounted
//	        UNMOUNTED               answer to delete-all: every pod deleted, its volumes unmounted, nothing in use
//	        IN-USE a,b              answer to in-use: GetVolumesInUse
//	        API-FAIL on|off         answer to api-fail: the switch is set
//	        FAILED what: error      a command or a wait failed; the agent keeps running
//	stdin:  add POD_JSON            add the pod (its JSON on the rest of the line) and wait for its volumes
//	        delete ns/name          delete a pod of the file or added, and wait until its volumes are unmounted
//	        delete-all              delete every pod, wait until nothing is mounted or in use
//	        in-use                  report GetVolumesInUse
//	        api-fail on|off         make lists and gets of PVCs, PVs and VolumeAttachments fail, or succeed again
//
// A wait for a pod's mounts ends without a message when the pod is
// deleted. The API switch acts on the fake API server's lists and gets:
// turned on after the informers have listed, it fails only their relists
// (the fake's watches do not end, so there are none); it is meant to be on
// from the start (--api-fail), to fail a restart.
//
// It runs until it is killed, SIGTERM or SIGINT, or stdin is closed (its
// parent went).
func runFakeAgent(args []string) int {
	fs := flag.NewFlagSet(fakeAgentCommand, flag.ContinueOnError)
	var o fakeAgentOptions
	var drvs stringList
	fs.StringVar(&o.root, "root-dir", "", "kubelet root directory (required)")
	fs.StringVar(&o.node, "node", "node-1", "this node's name")
	fs.StringVar(&o.objects, "objects", "", "JSON file of the fake API server's objects and the pods to add (required)")
	fs.Var(&drvs, "driver", "a CSI driver as name=/path/to/csi.sock (required, repeatable)")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "bound of each wait for mounts or unmounts")
	fs.BoolVar(&o.podsFirst, "pods-first", false, "hold the volume manager's informers (their first list of PVs) until every pod has been added and MarkPodsSynced called: the pod source syncs first")
	fs.BoolVar(&o.apiFail, "api-fail", false, "start with every list and get of PVCs, PVs and VolumeAttachments failing (stdin: api-fail off)")
	fs.StringVar(&o.bootIDFile, "boot-id-file", "", "read the node's boot ID from this file instead of /proc/sys/kernel/random/boot_id (tests simulate a reboot by changing it)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ok := len(drvs) > 0
	for _, d := range drvs {
		name, endpoint, found := strings.Cut(d, "=")
		ok = ok && found
		o.drivers = append(o.drivers, [2]string{name, endpoint})
	}
	if o.root == "" || o.objects == "" || !ok {
		fmt.Fprintln(os.Stderr, "agent-fake: --root-dir, --objects and --driver name=/path/to/csi.sock are required")
		return 2
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("agent-fake"))
	if err := fakeAgent(ctx, o, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent-fake:", err)
		return 1
	}
	return 0
}

// fakeAgentOptions are agent-fake's flags.
type fakeAgentOptions struct {
	root, node, objects string
	// drivers are the CSI drivers' names and socket paths, registered in
	// this order.
	drivers [][2]string
	// timeout bounds each wait for mounts or unmounts.
	timeout time.Duration
	// podsFirst holds the informers until the pods are added and synced.
	podsFirst bool
	// apiFail starts with the API reads failing.
	apiFail bool
	// bootIDFile replaces /proc/sys/kernel/random/boot_id (a simulated reboot).
	bootIDFile string
}

// apiFailResources are the resources whose lists and gets the api-fail
// switch fails.
var apiFailResources = []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"}

func fakeAgent(ctx context.Context, o fakeAgentOptions, in io.Reader, out io.Writer) error {
	client, pods, podsSynced, apiFail, err := fakeClient(o)
	if err != nil {
		return err
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: o.node, KubeClient: client, RootDir: o.root, Mounter: mount.New(""), BootIDPath: o.bootIDFile})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	var waits sync.WaitGroup
	defer func() { cancel(); waits.Wait(); <-ran }()
	for _, d := range o.drivers {
		if err := vm.Drivers().Register(ctx, d[0], d[1]); err != nil {
			return fmt.Errorf("registering driver %s: %w", d[0], err)
		}
	}

	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	a := &fakePods{vm: vm, ctx: runCtx, timeout: o.timeout, say: say, waits: &waits, known: map[string]*fakePod{}}
	// What runAgent does once its pod informer has synced: every running
	// pod added, then MarkPodsSynced at once.
	var first []*fakePod
	for _, p := range pods {
		first = append(first, a.add(p))
	}
	vm.MarkPodsSynced()
	close(podsSynced)
	say("SYNCED")
	waits.Go(func() { a.sayReady(first) })

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20) // a pod's JSON on one line
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil // the parent went
			}
			a.command(line, apiFail)
		}
	}
}

// fakeClient is a fake clientset holding the objects of o.objects, with the
// node's pods; its lists of volumes wait for podsSynced to be closed when
// o.podsFirst, and its lists and gets of apiFailResources fail while
// apiFail is set (o.apiFail at first).
func fakeClient(o fakeAgentOptions) (client *fake.Clientset, pods []*v1.Pod, podsSynced chan struct{}, apiFail *atomic.Bool, err error) {
	data, err := os.ReadFile(o.objects)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	var objs fakeObjects
	if err := json.Unmarshal(data, &objs); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", o.objects, err)
	}
	var all []runtime.Object
	for i := range objs.CSIDrivers {
		all = append(all, &objs.CSIDrivers[i])
	}
	for i := range objs.PersistentVolumes {
		all = append(all, &objs.PersistentVolumes[i])
	}
	for i := range objs.PersistentVolumeClaims {
		all = append(all, &objs.PersistentVolumeClaims[i])
	}
	for i := range objs.VolumeAttachments {
		all = append(all, &objs.VolumeAttachments[i])
	}
	pods = make([]*v1.Pod, len(objs.Pods))
	for i := range objs.Pods {
		pods[i] = &objs.Pods[i]
		all = append(all, pods[i])
	}
	client = fake.NewClientset(all...)
	podsSynced = make(chan struct{})
	if o.podsFirst {
		// The fake serialises its calls: every informer waits with this list.
		client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-podsSynced
			return false, nil, nil
		})
	}
	apiFail = new(atomic.Bool)
	apiFail.Store(o.apiFail)
	for _, res := range apiFailResources {
		for _, verb := range []string{"list", "get"} {
			client.PrependReactor(verb, res, func(k8stesting.Action) (bool, runtime.Object, error) {
				if apiFail.Load() {
					return true, nil, apierrors.NewServiceUnavailable("agent-fake: api-fail is on: " + verb + " " + res)
				}
				return false, nil, nil
			})
		}
	}
	return client, pods, podsSynced, apiFail, nil
}

// sayReady says READY with the number of the first pods mounted once each
// is mounted or deleted, unless one failed (which said FAILED).
func (a *fakePods) sayReady(first []*fakePod) {
	mounted, failed := 0, false
	for _, p := range first {
		switch err := p.waitMounted(); {
		case err == nil:
			mounted++
		case !errors.Is(err, errPodDeleted):
			failed = true // said FAILED, or the agent stops
		}
	}
	if !failed {
		a.say("READY %d", mounted)
	}
}

// errPodDeleted ends a wait for a pod's mounts when the pod is deleted.
var errPodDeleted = errors.New("the pod was deleted")

// fakePods are agent-fake's pods and their waits.
type fakePods struct {
	vm      *volumemanager.VolumeManager
	ctx     context.Context
	timeout time.Duration
	say     func(format string, args ...any)
	waits   *sync.WaitGroup
	// known are the pods added and not deleted, by "namespace/name"; only
	// the command loop (and the start, before it) touches it.
	known map[string]*fakePod
	order []string
}

// fakePod is one added pod; its mount wait ends when it is deleted.
type fakePod struct {
	a       *fakePods
	pod     *v1.Pod
	ctx     context.Context
	deleted context.CancelCauseFunc
	// mu is held by the mount wait and by the deletion: a wait must not
	// start after DeletePod, since WaitForAttachAndMount adds a pod it
	// does not know (and so would bring the deleted pod back).
	mu   sync.Mutex
	gone bool // DeletePod called
}

func (a *fakePods) add(pod *v1.Pod) *fakePod {
	key := pod.Namespace + "/" + pod.Name
	ctx, cancel := context.WithCancelCause(a.ctx)
	p := &fakePod{a: a, pod: pod, ctx: ctx, deleted: cancel}
	if old := a.known[key]; old != nil {
		old.deleted(errPodDeleted) // replaced (the same UID, or deleted first): its wait is the new one's
	} else {
		a.order = append(a.order, key)
	}
	a.known[key] = p
	// A refused pod (another node's) is told by its wait, which returns
	// the same error at once: FAILED.
	_ = a.vm.AddPod(pod)
	return p
}

// waitMounted waits for the pod's volumes and says MOUNTED or FAILED; a
// wait ended by the pod's deletion says nothing and returns errPodDeleted.
func (p *fakePod) waitMounted() error {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return errPodDeleted
	}
	ctx, done := context.WithTimeout(p.ctx, p.a.timeout)
	err := p.a.vm.WaitForAttachAndMount(ctx, p.pod)
	done()
	p.mu.Unlock()
	switch {
	case err != nil && errors.Is(context.Cause(p.ctx), errPodDeleted):
		return errPodDeleted
	case err != nil && p.a.ctx.Err() != nil:
		return err // the agent stops: nobody to tell
	case err != nil:
		p.a.say("FAILED mount %s/%s: %v", p.pod.Namespace, p.pod.Name, err)
		return err
	}
	if len(p.pod.Spec.Volumes) > 0 { // not the many pods without volumes
		p.a.say("MOUNTED %s/%s", p.pod.Namespace, p.pod.Name)
	}
	return nil
}

// command runs one stdin line.
func (a *fakePods) command(line string, apiFail *atomic.Bool) {
	verb, arg, _ := strings.Cut(line, " ")
	switch verb {
	case "add":
		var pod v1.Pod
		if err := json.Unmarshal([]byte(arg), &pod); err != nil {
			a.say("FAILED add: %v", err)
			return
		}
		p := a.add(&pod)
		a.say("ADDED %s/%s", pod.Namespace, pod.Name)
		a.waits.Go(func() { _ = p.waitMounted() })
	case "delete":
		p := a.known[arg]
		if p == nil {
			a.say("FAILED delete %s: no such pod", arg)
			return
		}
		a.remove(arg)
		a.say("DELETED %s", arg)
		a.waits.Go(func() {
			ctx, done := context.WithTimeout(a.ctx, a.timeout)
			defer done()
			if err := a.vm.WaitForUnmount(ctx, p.pod); err != nil {
				if a.ctx.Err() == nil {
					a.say("FAILED unmount %s: %v", arg, err)
				}
				return
			}
			a.say("GONE %s", arg)
		})
	case "delete-all":
		var pods []*v1.Pod
		for _, key := range a.order {
			pods = append(pods, a.known[key].pod)
		}
		for _, key := range slices.Clone(a.order) {
			a.remove(key)
		}
		a.waits.Go(func() {
			if err := deleteAll(a.ctx, a.vm, pods, a.timeout); err != nil {
				if a.ctx.Err() == nil {
					a.say("FAILED delete-all: %v", err)
				}
			} else {
				a.say("UNMOUNTED")
			}
		})
	case "in-use":
		var names []string
		for _, n := range a.vm.GetVolumesInUse() {
			names = append(names, string(n))
		}
		a.say("IN-USE %s", strings.Join(names, ","))
	case "api-fail":
		if arg != "on" && arg != "off" {
			a.say("FAILED api-fail %q: want on or off", arg)
			return
		}
		apiFail.Store(arg == "on")
		a.say("API-FAIL %s", arg)
	case "":
	default:
		a.say("FAILED unknown command %q", line)
	}
}

// remove forgets a known pod, ends its mount wait and deletes it from the
// volume manager (DeletePod alone; the caller waits as it needs).
func (a *fakePods) remove(key string) {
	p := a.known[key]
	delete(a.known, key)
	a.order = slices.DeleteFunc(a.order, func(k string) bool { return k == key })
	p.deleted(errPodDeleted) // ends its mount wait, if one runs
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone = true
	a.vm.DeletePod(p.pod)
}

// deleteAll deletes every pod, waits until their volumes are unmounted and
// then until every device is unstaged (WaitForUnstaged: volumesInUse lists
// only attachable volumes, so it cannot tell).
func deleteAll(ctx context.Context, vm *volumemanager.VolumeManager, pods []*v1.Pod, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, p := range pods {
		vm.DeletePod(p)
	}
	for _, p := range pods {
		if err := vm.WaitForUnmount(ctx, p); err != nil {
			return err
		}
	}
	return vm.WaitForUnstaged(ctx)
}

// stringList is a flag that may be given more than once (--driver).
type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
