package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopGrace is how long Stop gives containerd after SIGTERM.
const stopGrace = 10 * time.Second

// Sandboxes lists the runtime's pod sandboxes, ready or not.
func (r *Runtime) Sandboxes(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	resp, err := r.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("realnode: listing pod sandboxes: %w", err)
	}
	return resp.Items, nil
}

// Containers lists the runtime's containers, running or not.
func (r *Runtime) Containers(ctx context.Context) ([]*runtimeapi.Container, error) {
	resp, err := r.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("realnode: listing containers: %w", err)
	}
	return resp.Containers, nil
}

// RemoveAll stops and removes every pod sandbox (and so its containers)
// and every container left, through the CRI, as the kubelet's garbage
// collector would; it returns how many sandboxes it removed.
func (r *Runtime) RemoveAll(ctx context.Context) (int, error) {
	sandboxes, err := r.Sandboxes(ctx)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, s := range sandboxes {
		if _, err := r.cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping sandbox %s of pod %s/%s: %w", s.Id, s.Metadata.Namespace, s.Metadata.Name, err))
			continue
		}
		if _, err := r.cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox %s of pod %s/%s: %w", s.Id, s.Metadata.Namespace, s.Metadata.Name, err))
		}
	}
	containers, err := r.Containers(ctx)
	if err != nil {
		return len(sandboxes), errors.Join(append(errs, err)...)
	}
	for _, c := range containers {
		if _, err := r.cri.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing container %s: %w", c.Id, err))
		}
	}
	return len(sandboxes), errors.Join(errs...)
}

// Stop removes every pod sandbox and container (RemoveAll), stops
// containerd, and then makes sure nothing is left: no shim, runc
// container or other process that names the runtime's directory, no mount
// below it. What it had to kill or unmount itself is in the error, as is
// anything it could not remove; the directory is removed only when nothing
// is mounted below it. It is safe to call more than once.
func (r *Runtime) Stop(ctx context.Context) error {
	var errs []error
	if r.cri != nil && !r.hasExited() {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := r.RemoveAll(rctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
	}
	if r.cmd != nil && !r.hasExited() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.exited
			errs = append(errs, fmt.Errorf("containerd ignored SIGTERM for %v: killed", stopGrace))
		}
	}
	// The runc containers a shim left (a shim killed, a container whose
	// removal failed) and the shims themselves: found by the paths they
	// were started with.
	errs = append(errs, r.killRunc(ctx))
	if pids := ProcessesNaming(r.dir); len(pids) > 0 {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, fmt.Errorf("processes left that name %s, killed: %v", r.dir, pids))
		waitGone(pids)
	}
	removeEmptyDirs()
	errs = append(errs, unmountBelow(r.dir))
	if ms, err := MountsUnder(r.dir); err != nil || len(ms) > 0 {
		errs = append(errs, fmt.Errorf("not removing %s: %v still mounted below it (%v)", r.dir, ms, err))
	} else if err := os.RemoveAll(r.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("realnode: stopping the runtime in %s: %w", r.dir, err)
	}
	return nil
}

func (r *Runtime) hasExited() bool {
	if r.exited == nil {
		return true
	}
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// killRunc kills and deletes every runc container left in the runtime's
// runc root (one directory per containerd namespace).
func (r *Runtime) killRunc(ctx context.Context) error {
	roots, _ := filepath.Glob(filepath.Join(r.runcRoot, "*"))
	var left []string
	for _, root := range roots {
		ids, _ := os.ReadDir(root)
		for _, id := range ids {
			left = append(left, id.Name())
			_ = exec.CommandContext(ctx, runcBin, "--root", root, "kill", "--all", id.Name(), "KILL").Run()
			if out, err := exec.CommandContext(ctx, runcBin, "--root", root, "delete", "--force", id.Name()).CombinedOutput(); err != nil {
				return fmt.Errorf("runc delete %s: %w: %s", id.Name(), err, bytes.TrimSpace(out))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("runc containers left, killed and deleted: %v", left)
	}
	return nil
}

// ProcessesNaming lists the processes whose command line has an argument
// that is dir or below it (containerd's shims name its socket, the
// containers' processes nothing of it), other than this process.
func ProcessesNaming(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
			if a := string(arg); a == dir || strings.HasPrefix(a, dir+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// waitGone waits until none of pids is alive, for up to 10 seconds: a
// SIGKILLed process is gone once the kernel has torn it down.
func waitGone(pids []int) {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// unmountBelow unmounts whatever is still mounted at dir or below it
// (Unmount) and says what that was: containerd unmounts its own (the
// containers' root file systems, shm, the sandboxes' network namespaces)
// when a sandbox is removed.
func unmountBelow(dir string) error {
	ms, err := MountsUnder(dir)
	if err != nil || len(ms) == 0 {
		return err
	}
	return errors.Join(fmt.Errorf("mounts left below %s, unmounted: %v", dir, ms), Unmount(dir))
}

// removeEmptyDirs removes what containerd and its shims make outside the
// runtime's directory, where empty: the parent cgroup of the CRI's
// containers (k8s.io, in every hierarchy) and the shims' socket directory.
// An rmdir of a directory another runtime still uses fails and is left.
func removeEmptyDirs() {
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, d := range append(cgroups, "/run/containerd/s", "/run/containerd") {
		_ = unix.Rmdir(d)
	}
}
