package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// NetNS is a network namespace made for a node, with a veth pair into it:
// a node whose processes run in it has an address of its own that is not
// loopback (the API server refuses to proxy to a loopback node address,
// which pod logs and some specs need), and nothing is added to the host's
// own interfaces. No route leads out of it: its default route names the
// node's end of the pair with no gateway (a program that looks for the
// default route's interface, as the API server does for its advertised
// address, finds the node's address), so a packet for any other address
// is sent to the pair as if on its link, where the host answers for none
// of them (no proxy ARP). The node's traffic stays on its loopback, its
// pods' bridge and the pair.
type NetNS struct {
	// Name is its name (ip netns), Path the file that holds it
	// (/run/netns/{Name}), for InNetNS and Options.NetNS.
	Name, Path string
	// HostAddr is the host end's address, NodeAddr the node's end's.
	HostAddr, NodeAddr netip.Prefix
	// HostIf and NodeIf are the pair's interface names.
	HostIf, NodeIf string
}

// NetNSOptions configures NewNetNS. Name is required.
type NetNSOptions struct {
	// Name is the namespace's name; its pair is {Name}-h and {Name}-n,
	// so at most 13 characters.
	Name string
	// HostAddr and NodeAddr are the pair's addresses. Unset: 10.230.0.1/30
	// and 10.230.0.2/30.
	HostAddr, NodeAddr netip.Prefix
}

// NewNetNS makes the namespace and its veth pair, both ends up with their
// addresses, the namespace's loopback up and its default route on the
// pair. On error nothing is left.
func NewNetNS(ctx context.Context, opts NetNSOptions) (*NetNS, error) {
	if opts.Name == "" || len(opts.Name) > 13 {
		return nil, fmt.Errorf("realnode: network namespace name %q: 1 to 13 characters", opts.Name)
	}
	if !opts.HostAddr.IsValid() {
		opts.HostAddr = netip.MustParsePrefix("10.230.0.1/30")
	}
	if !opts.NodeAddr.IsValid() {
		opts.NodeAddr = netip.MustParsePrefix("10.230.0.2/30")
	}
	n := named(opts.Name)
	n.HostAddr, n.NodeAddr = opts.HostAddr, opts.NodeAddr
	if err := ip(ctx, "netns", "add", n.Name); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"link", "add", n.HostIf, "type", "veth", "peer", "name", n.NodeIf, "netns", n.Name},
		{"addr", "add", n.HostAddr.String(), "dev", n.HostIf},
		{"link", "set", n.HostIf, "up"},
		{"-n", n.Name, "addr", "add", n.NodeAddr.String(), "dev", n.NodeIf},
		{"-n", n.Name, "link", "set", n.NodeIf, "up"},
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "route", "add", "default", "dev", n.NodeIf},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return nil, errors.Join(err, n.Delete(context.WithoutCancel(ctx)))
		}
	}
	return n, nil
}

// named is the namespace called name: its path and the pair's ends.
func named(name string) *NetNS {
	return &NetNS{Name: name, Path: "/run/netns/" + name, HostIf: name + "-h", NodeIf: name + "-n"}
}

// DeleteNetNS removes the namespace called name and its pair, if there (a
// namespace a killed process left behind), and says whether it was.
func DeleteNetNS(ctx context.Context, name string) (found bool, err error) {
	n := named(name)
	if _, err := os.Stat(n.Path); err == nil {
		found = true
	}
	return found, n.Delete(ctx)
}

// Delete removes the namespace, and with it the pair and any bridge in it.
// The processes that ran in it must have exited: a namespace a process
// still holds outlives its name.
func (n *NetNS) Delete(ctx context.Context) error {
	var errs []error
	if _, err := os.Stat("/sys/class/net/" + n.HostIf); err == nil {
		errs = append(errs, ip(ctx, "link", "del", n.HostIf))
	}
	if _, err := os.Stat(n.Path); err == nil {
		errs = append(errs, ip(ctx, "netns", "del", n.Name))
	}
	return errors.Join(errs...)
}

// InNetNS is args run in the network namespace at path (by nsenter, which
// enters the network namespace alone: mounts made there are the host's).
func InNetNS(path string, args []string) []string {
	return append([]string{"nsenter", "--net=" + path, "--"}, args...)
}

func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("realnode: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
