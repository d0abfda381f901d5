package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
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
// first, which makes the order of a restart deterministic. It talks on
// stdio:
//
//	stdout: SYNCED                  every pod added, MarkPodsSynced called
//	        MOUNTED ns/name         the pod's volumes are mounted (pods with volumes only)
//	        READY n                 all n pods' volumes are mounted
//	        UNMOUNTED               answer to delete-all: every pod deleted, its volumes unmounted, nothing in use
//	        IN-USE a,b              answer to in-use: GetVolumesInUse
//	        FAILED what: error      a wait failed; the agent keeps running
//	stdin:  delete-all | in-use
//
// It runs until it is killed, SIGTERM or SIGINT, or stdin is closed (its
// parent went).
func runFakeAgent(args []string) int {
	fs := flag.NewFlagSet(fakeAgentCommand, flag.ContinueOnError)
	var (
		root, node, objectsPath, drv string
		timeout                      time.Duration
		podsFirst                    bool
	)
	fs.StringVar(&root, "root-dir", "", "kubelet root directory (required)")
	fs.StringVar(&node, "node", "node-1", "this node's name")
	fs.StringVar(&objectsPath, "objects", "", "JSON file of the fake API server's objects and the pods to add (required)")
	fs.StringVar(&drv, "driver", "", "the CSI driver as name=/path/to/csi.sock (required)")
	fs.DurationVar(&timeout, "timeout", time.Minute, "bound of each wait for mounts or unmounts")
	fs.BoolVar(&podsFirst, "pods-first", false, "hold the volume manager's informers (their first list of PVs) until every pod has been added and MarkPodsSynced called: the pod source syncs first")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	name, endpoint, ok := strings.Cut(drv, "=")
	if root == "" || objectsPath == "" || !ok {
		fmt.Fprintln(os.Stderr, "agent-fake: --root-dir, --objects and --driver name=/path/to/csi.sock are required")
		return 2
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("agent-fake"))
	if err := fakeAgent(ctx, root, node, objectsPath, name, endpoint, timeout, podsFirst, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent-fake:", err)
		return 1
	}
	return 0
}

func fakeAgent(ctx context.Context, root, node, objectsPath, driverName, endpoint string, timeout time.Duration, podsFirst bool, in io.Reader, out io.Writer) error {
	data, err := os.ReadFile(objectsPath)
	if err != nil {
		return err
	}
	var objs fakeObjects
	if err := json.Unmarshal(data, &objs); err != nil {
		return fmt.Errorf("%s: %w", objectsPath, err)
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
	pods := make([]*v1.Pod, len(objs.Pods))
	for i := range objs.Pods {
		pods[i] = &objs.Pods[i]
		all = append(all, pods[i])
	}
	client := fake.NewClientset(all...)
	podsSynced := make(chan struct{})
	if podsFirst {
		// The fake serialises its calls: every informer waits with this list.
		client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-podsSynced
			return false, nil, nil
		})
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.New("")})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	defer func() { cancel(); <-ran }()
	if err := vm.Drivers().Register(ctx, driverName, endpoint); err != nil {
		return fmt.Errorf("registering driver %s: %w", driverName, err)
	}

	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	// What runAgent does once its pod informer has synced: every running
	// pod added, then MarkPodsSynced at once.
	for _, p := range pods {
		vm.AddPod(p)
	}
	vm.MarkPodsSynced()
	close(podsSynced)
	say("SYNCED")
	failed := false
	for _, p := range pods {
		waitCtx, done := context.WithTimeout(ctx, timeout)
		err := vm.WaitForAttachAndMount(waitCtx, p)
		done()
		if err != nil {
			say("FAILED mount %s/%s: %v", p.Namespace, p.Name, err)
			failed = true
			continue
		}
		if len(p.Spec.Volumes) > 0 { // not the many pods without volumes
			say("MOUNTED %s/%s", p.Namespace, p.Name)
		}
	}
	if !failed {
		say("READY %d", len(pods))
	}

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
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
			switch line {
			case "delete-all":
				if err := deleteAll(ctx, vm, pods, timeout); err != nil {
					say("FAILED delete-all: %v", err)
				} else {
					say("UNMOUNTED")
				}
			case "in-use":
				var names []string
				for _, n := range vm.GetVolumesInUse() {
					names = append(names, string(n))
				}
				say("IN-USE %s", strings.Join(names, ","))
			case "":
			default:
				say("FAILED unknown command %q", line)
			}
		}
	}
}

// deleteAll deletes every pod, waits until their volumes are unmounted and
// then until no volume is in use any more (every device unstaged).
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
	for len(vm.GetVolumesInUse()) > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("volumes still in use: %v: %w", vm.GetVolumesInUse(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
