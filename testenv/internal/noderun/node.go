package noderun

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodevol/nodevol/internal/realnode"
	"golang.org/x/sys/unix"
)

// KubeletRoot is the root directory the suites give the kubelet and read
// in some specs, whatever the kubelet's flags say.
const KubeletRoot = "/var/lib/kubelet"

// ServeRegistry serves images on addr (the host's end of the node's veth
// pair), the node's only registry (containerd's mirror of registry.k8s.io): the
// specs that pull (pull policy Always on the pause image after each
// eviction spec) or run after the kubelet's image garbage collector
// removed the images under disk pressure pull them from here, where
// upstream's jobs pull them again from registry.k8s.io.
func ServeRegistry(addr netip.Addr, images []realnode.Image) (url string, stop func() error, err error) {
	reg, err := realnode.NewRegistry(images...)
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return "", nil, fmt.Errorf("serving the node's registry: %w", err)
	}
	srv := &http.Server{Handler: reg, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), srv.Close, nil
}

// PathWithout makes dir a directory of links to every command of this
// machine's PATH but the ones named, and returns it as a PATH.
func PathWithout(dir string, names ...string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			if err := os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// namespacesEnv is set in the run's own namespaces (Reexec).
const namespacesEnv = "NODEVOL_NODERUN_NS"

// InNamespaces says whether this process is the run Reexec started in
// namespaces of its own.
func InNamespaces() bool { return os.Getenv(namespacesEnv) != "" }

// Reexec runs this command again, with the same arguments, in a mount
// namespace of its own (unshare, every mount private to it at first), and
// returns its exit code. The node's mounts (the kubelet's root and the
// pods' volumes, the containers' root file systems) are then the run's
// alone: a kubelet of the machine, or a test's, shares nothing with the
// run's, not even /var/lib/kubelet/device-plugins, which every kubelet
// uses whatever its root; and whatever the run leaves mounted goes with
// the namespace when its last process exits.
//
// With netns (a network namespace's file, NetNS.Path), the run is in that
// network namespace: every process it starts is on the node's network.
//
// With pid, the run also gets a PID namespace of its own, with its own
// /proc: its first process (PID 1) is the run's init (RunAsInit), and what
// a pod of the node reads at /proc/1 (a privileged pod that enters "the
// host's" mount namespace through /proc/1/ns/mnt, as upstream's storage
// suites' host-exec pods do) is the run's, never the machine's.
func Reexec(netns string, pid bool) int {
	self, err := os.Executable()
	if err != nil {
		log.Print(err)
		return 1
	}
	args := []string{"--mount", "--propagation", "private"}
	if pid {
		args = append(args, "--pid", "--fork", "--mount-proc")
	}
	argv := append(append([]string{"unshare"}, args...), "--", self)
	if netns != "" {
		argv = realnode.InNetNS(netns, argv)
	}
	argv = append(argv, os.Args[1:]...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), namespacesEnv+"=1")
	// unshare execs this command in its place (or forks it, with pid,
	// and passes signals on): signals reach the run.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	return exitCode(cmd.Run(), "running in namespaces of its own")
}

// initChildEnv is set in the process the run's init starts (RunAsInit).
const initChildEnv = "NODEVOL_NODERUN_INIT_CHILD"

// RunAsInit makes a run Reexec started with pid its PID namespace's init:
// as PID 1 it starts this command again, with the same arguments, as its
// child, passes SIGINT and SIGTERM on to it, reaps every process whose
// parent exits before it (containerd's shims, a pod's leftovers), and
// returns the child's exit code once the child exits (the kernel then
// kills what is left in the namespace). ok is false in any other process,
// the child included, which goes on with the run.
func RunAsInit() (code int, ok bool) {
	if os.Getpid() != 1 || os.Getenv(initChildEnv) != "" {
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		log.Print(err)
		return 1, true
	}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), initChildEnv+"=1")
	if err := cmd.Start(); err != nil {
		log.Printf("starting the run under its init: %v", err)
		return 1, true
	}
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	// Every child of PID 1 is reaped here, the run's own too: exec.Cmd's
	// Wait is never called.
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			log.Printf("the run's init waiting for its children: %v", err)
			return 1, true
		}
		if pid != cmd.Process.Pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus(), true
		case ws.Signaled():
			return 128 + int(ws.Signal()), true
		}
	}
}

// exitCode is the exit code of a command that ran with err.
func exitCode(err error, what string) int {
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	log.Printf("%s: %v", what, err)
	return 1
}

// ShareMounts makes every mount of the run's namespace shared again, in
// peer groups of the namespace's own (unshare made them private): a node
// shares its mounts as a systemd host does, which the suite's mount
// propagation specs and the kubelet expect.
func ShareMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making the run's mounts shared: %w", err)
	}
	return nil
}

// KubeletRootIn gives the kubelet the root directory the suite assumes,
// /var/lib/kubelet, as a directory below work bind-mounted there in the
// run's mount namespace: whatever the machine has at that path stays
// untouched and unseen. The mount is a peer group of its own (a kubelet
// makes its root a shared mount of itself at its first start), so that
// what the kubelet mounts below it is not also mounted below work. It
// returns the undo: what is still mounted below the root when the suite
// has stopped is logged and unmounted (the suite stops the kubelet as soon
// as its last spec ends, while the last specs' namespaces are still being
// deleted, on either kubelet), and the mount point is removed if the run
// made it.
func KubeletRootIn(work string) (func() error, error) {
	dir := filepath.Join(work, "kubelet-root")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	_, statErr := os.Lstat(KubeletRoot)
	made := os.IsNotExist(statErr)
	if err := os.MkdirAll(KubeletRoot, 0o755); err != nil {
		return nil, err
	}
	for _, m := range []struct {
		src   string
		flags uintptr
	}{{dir, unix.MS_BIND}, {"", unix.MS_PRIVATE}, {"", unix.MS_SHARED}} {
		if err := unix.Mount(m.src, KubeletRoot, "", m.flags, ""); err != nil {
			return nil, fmt.Errorf("mounting the kubelet's root %s from %s: %w", KubeletRoot, dir, err)
		}
	}
	return func() error {
		if ms, err := realnode.MountsUnder(KubeletRoot); err == nil {
			for _, m := range ms {
				if m.Point != KubeletRoot {
					log.Printf("left mounted when the suite stopped the kubelet, unmounting: %s (%s)", m.Point, m.FSType)
				}
			}
		}
		if err := realnode.Unmount(KubeletRoot); err != nil {
			return err
		}
		if made {
			return os.Remove(KubeletRoot)
		}
		return nil
	}, nil
}

// CadvisorContainerd is where the kubelet's cAdvisor finds containerd:
// its own flag's default, which the kubelet neither exposes nor sets from
// its runtime endpoint. Without it cAdvisor sees no container: the
// /metrics/cadvisor endpoint and the summary's container stats have none.
const CadvisorContainerd = "/run/containerd/containerd.sock"

// RunContainerdIn bind-mounts a directory below work on /run/containerd in
// the run's mount namespace (DirIn) and returns it, for a link to the
// node's containerd socket at CadvisorContainerd; containerd 1.6's shims
// put their sockets there too (s/), wherever containerd's state is. The
// machine's /run/containerd stays untouched and unseen.
func RunContainerdIn(work string) (string, func() error, error) {
	return DirIn(work, "run-containerd", filepath.Dir(CadvisorContainerd))
}

// DirIn bind-mounts work/name on point in the run's mount namespace and
// returns it: a directory the node's programs use at a fixed path of the
// machine's (/run/containerd; /var/lib/csi-hostpath-data, where
// csi-driver-host-path's pods keep their volumes) is the run's, and the
// machine's stays untouched and unseen. The undo unmounts it and removes
// the mount point if the run made it and nothing else put a file there
// since.
func DirIn(work, name, point string) (string, func() error, error) {
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	_, statErr := os.Lstat(point)
	made := os.IsNotExist(statErr)
	if err := os.MkdirAll(point, 0o700); err != nil {
		return "", nil, err
	}
	if err := unix.Mount(dir, point, "", unix.MS_BIND, ""); err != nil {
		return "", nil, fmt.Errorf("mounting %s on %s: %w", dir, point, err)
	}
	return dir, func() error {
		if err := realnode.Unmount(point); err != nil {
			return err
		}
		// The machine's programs (its containerd, or a test's) may have
		// put files there since: then it is theirs.
		if !made {
			return nil
		}
		if err := os.Remove(point); err != nil && !os.IsNotExist(err) && !errors.Is(err, syscall.ENOTEMPTY) {
			return err
		}
		return nil
	}, nil
}

// KillProcesses kills the processes whose command lines name any of dirs
// (a run's binaries, or a supervisor's directory) if they are still
// running (an interrupted run), and says which it killed.
func KillProcesses(dirs ...string) error {
	var pids []int
	for _, d := range dirs {
		pids = append(pids, realnode.ProcessesNaming(d)...)
	}
	if len(pids) == 0 {
		return nil
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return fmt.Errorf("processes left by the run, killed: %v", pids)
}

// RemoveWork removes the run's directory, unless something is still
// mounted below it: a removal would go through the mount.
func RemoveWork(work string) error {
	if ms, err := realnode.MountsUnder(work); err != nil || len(ms) > 0 {
		return fmt.Errorf("not removing %s: %v still mounted below it (%v)", work, ms, err)
	}
	return os.RemoveAll(work)
}

// CopyFile copies the file from to the file to (a log, into the run's
// output).
func CopyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
