package noderun

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodevol/nodevol/internal/realnode"
)

// Undo is what a run made, taken down in reverse order by Run.
type Undo []func() error

// Add records how to take down what was just made.
func (u *Undo) Add(f func() error) { *u = append(*u, f) }

// Run takes everything down, last made first, whatever failed, and
// returns what could not be.
func (u Undo) Run() error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		errs = append(errs, u[i]())
	}
	return errors.Join(errs...)
}

// NodeOptions configures StartNode.
type NodeOptions struct {
	// Work is the run's directory; the caller removes it (RemoveWork).
	Work string
	// Logs is where containerd's log is copied when the node stops.
	Logs string
	// Images are imported and served by the node's registry on
	// RegistryAddr.
	Images       []realnode.Image
	RegistryAddr netip.Addr
	// NetNS and PodSubnet are realnode.Options'.
	NetNS, PodSubnet string
}

// StartNode makes a real node in the run's mount namespace: the run's
// mounts shared, the kubelet's root at KubeletRoot, the node's registry,
// containerd's run directory (with the link cAdvisor looks for) and
// containerd itself. Everything it made is in undo, also when it fails.
func StartNode(ctx context.Context, o NodeOptions, undo *Undo) (*realnode.Runtime, error) {
	if err := ShareMounts(); err != nil {
		return nil, err
	}
	root, err := KubeletRootIn(o.Work)
	if err != nil {
		return nil, err
	}
	undo.Add(root)
	mirror, stopRegistry, err := ServeRegistry(o.RegistryAddr, o.Images)
	if err != nil {
		return nil, err
	}
	undo.Add(stopRegistry)
	runContainerd, unmountRun, err := RunContainerdIn(o.Work)
	if err != nil {
		return nil, err
	}
	undo.Add(unmountRun)
	rt, err := realnode.Start(ctx, realnode.Options{Dir: filepath.Join(o.Work, "rt"), NetNS: o.NetNS, PodSubnet: o.PodSubnet, Images: o.Images, Mirror: mirror})
	if err != nil {
		return nil, err
	}
	undo.Add(func() error {
		_ = os.MkdirAll(o.Logs, 0o755)
		_ = CopyFile(rt.Log(), filepath.Join(o.Logs, "containerd.log"))
		return rt.Stop(context.WithoutCancel(ctx))
	})
	if err := os.Symlink(strings.TrimPrefix(rt.Endpoint, "unix://"), filepath.Join(runContainerd, filepath.Base(CadvisorContainerd))); err != nil {
		return nil, err
	}
	return rt, nil
}
