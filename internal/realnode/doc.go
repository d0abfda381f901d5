// Package realnode is a real node's container runtime for tests: Debian's
// containerd 1.6 and runc started by hand, with a directory of their own,
// and images built here from source (busybox from this machine's static
// busybox or another, the pod sandbox's pause from this module, and this
// machine's programs with their libraries, HostProgram) imported under the
// names upstream's suites use, so that nothing is ever pulled. A kubelet
// (the stock one or the fork) runs real containers on it, through its CRI
// endpoint (Runtime.Endpoint); Kubernetes' node e2e suite does too.
// Where a node must pull (a pod with pull policy Always, an image the
// kubelet's garbage collector removed), a Registry serving the same images
// is containerd's only endpoint for registry.k8s.io (Options.Mirror):
// nothing is pulled from outside the machine.
//
// What this kind of machine needs, and Start sets (see configTemplate):
// cgroup v1 hybrid, so runc with cgroupfs (crun refuses the layout); the
// native snapshotter; oom_score_adj never lowered (the machine refuses
// it); runc also under the runtime handler test-handler, which the suites'
// RuntimeClass specs name; a CNI network, loopback only for hostNetwork pods, or a bridge
// (Options.PodSubnet) inside a network namespace made for the node
// (NewNetNS), never on the host's own interfaces.
//
// Stop leaves nothing: every sandbox and container is removed through the
// CRI, containerd stopped, and then any shim, runc container or mount
// that is still there is killed or unmounted and reported as an error, so
// a test that leaks fails.
//
// The Makefile installs the packages (containerd, runc,
// containernetworking-plugins, busybox-static) as root; Missing names
// those a machine lacks, for a test's skip message.
package realnode
