package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/testenv"
)

// process is a component of the cluster run as a process of its own, its
// output in {logs}/{name}.log.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// start starts argv as the component name.
func start(name, logs string, argv []string) (*process, error) {
	f, err := os.Create(filepath.Join(logs, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	log.Printf("started %s (pid %d): %v", name, cmd.Process.Pid, argv)
	return p, nil
}

// stopTimeout is how long a component has to exit after SIGTERM before it
// is killed.
const stopTimeout = 30 * time.Second

// stop stops the component (SIGTERM, then SIGKILL) and waits for it. A
// component that had exited by itself before is an error: the cluster
// lost it during the run.
func (p *process) stop() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited during the run: %v", p.name, p.err)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// exited says whether the component has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// controllerManagerArgs are kube-controller-manager's flags: every
// controller that is on by default (among them attach/detach, the
// persistent volume binder and expander, pvc- and pv-protection, the
// namespace, service account and garbage collector controllers and the
// root CA publisher), each with its own service account's credentials, as
// upstream's local-up-cluster runs it.
func controllerManagerArgs(env *testenv.Env, kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--use-service-account-credentials",
		"--service-account-private-key-file=" + env.ServiceAccountKeyFile(),
		"--root-ca-file=" + env.CAFile(),
		"--controllers=*",
		"--leader-elect=false",
		"--pvclaimbinder-sync-period=15s",
		"--v=2",
	}
}

// schedulerArgs are kube-scheduler's flags.
func schedulerArgs(kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--v=2",
	}
}

// kubeletConfig is the node's KubeletConfiguration: what this kind of
// machine needs (cgroup v1 allowed, which the kubelet refuses since 1.35
// unless told; no swap check; cgroupfs, as containerd is configured), its
// server open to the API server without credentials (anonymous, always
// allowed: the node's address is on the run's own network only), and no
// image garbage collection or image-based eviction: nothing can be pulled
// again from outside. The same file for the stock kubelet and the fork.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /
containerRuntimeEndpoint: %[1]s
imageServiceEndpoint: %[1]s
podCIDR: %[2]q
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
serializeImagePulls: false
volumeStatsAggPeriod: 10s
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
`

// waitReady waits until the node is Ready and the default namespace has
// its service account and root CA (the controller manager works): the
// suite itself would wait for either for many minutes before failing.
func waitReady(ctx context.Context, client kubernetes.Interface, node string, components ...*process) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, p := range components {
			if p.exited() {
				return false, fmt.Errorf("%s exited: %v", p.name, p.err)
			}
		}
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			last = fmt.Sprintf("node %s: %v", node, err)
			return false, nil
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			last = fmt.Sprintf("node %s is not Ready", node)
			return false, nil
		}
		if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			last = fmt.Sprintf("service account default/default: %v", err)
			return false, nil
		}
		if _, err := client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			last = fmt.Sprintf("config map default/kube-root-ca.crt: %v", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the cluster did not become ready (%s): %w", last, err)
	}
	return nil
}

// drain deletes the namespaces the suite left (it deletes its own without
// waiting) and waits until no pod is left on the node, so that the
// kubelet tears every volume down before it is stopped.
func drain(ctx context.Context, client kubernetes.Interface) error {
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ns := range nss.Items {
		switch ns.Name {
		case "default", "kube-system", "kube-public", "kube-node-lease":
			continue
		}
		if err := client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	var left int
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		left = len(pods.Items)
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d pods left on the node after the suite: %w", left, err)
	}
	return nil
}
