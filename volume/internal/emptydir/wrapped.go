package emptydir

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// wrappedPrefix starts the name of the emptyDir under another plugin's
// volume, as the kubelet's NewWrapperMounter names it: its ready file is
// pods/{uid}/plugins/kubernetes.io~empty-dir/wrapped_{name}/ready.
const wrappedPrefix = "wrapped_"

// Wrapper keeps the content of another plugin's volumes in an emptyDir, as
// the kubelet's configMap, secret, downwardAPI and projected plugins do
// (their wrapped emptyDir): a volume's directory is the other plugin's,
// {root}/pods/{uid}/volumes/{escaped plugin name}/{name}, a tmpfs for
// content that must not reach the disk (secrets, projected volumes), and
// its ready file is that of an emptyDir named wrapped_{name}. Set up,
// torn down and reconstructed as an emptyDir is; the other plugin writes
// the content.
type Wrapper struct{ p *plugin }

// NewWrapper returns the wrapper of plugin pluginName's volumes (e.g.
// "kubernetes.io/secret"), whose kind title names them in logs
// ("secret"); cfg is an emptyDir plugin's.
func NewWrapper(cfg Config, title, pluginName string) (*Wrapper, error) {
	p, err := newPlugin(cfg)
	if err != nil {
		return nil, err
	}
	p.name, p.escaped, p.title, p.wrapped = pluginName, strings.ReplaceAll(pluginName, "/", "~"), title, true
	return &Wrapper{p}, nil
}

// MemorySize is the size in bytes of a wrapped tmpfs for pod, as the
// kubelet sizes it (an emptyDir of medium Memory with no sizeLimit): the
// smaller of the pod's memory limit and the node's allocatable memory; 0
// when neither is known. A node whose allocatable memory cannot be read
// yet is an error wrapping volume.ErrNotReady.
func (w *Wrapper) MemorySize(pod *v1.Pod) (int64, error) {
	alloc, err := w.p.allocatable()
	if err != nil {
		return 0, err
	}
	return memorySize(alloc, podMemoryLimit(pod), nil), nil
}

// Path returns the directory of pod uid's volume specName, relative to the
// root and absolute; the names are checked to be one path component each.
func (w *Wrapper) Path(uid types.UID, specName string) (rel, abs string, err error) {
	at, err := w.p.volumePaths(uid, specName)
	return at.dir, at.abs, err
}

// SetUp makes vol's directory, a tmpfs of memorySize bytes (0: unbounded)
// when memory, unless it is set up already (its ready file is there and,
// in memory, its tmpfs mounted), and returns its absolute path. An error
// once the directory exists wraps volume.ErrInProgress.
func (w *Wrapper) SetUp(ctx context.Context, vol podvol.PodVolume, memory bool, memorySize int64) (string, error) {
	at, err := w.p.volumePaths(vol.Pod.UID, vol.SpecName)
	if err != nil {
		return "", err
	}
	m := medium{kind: onDisk}
	if memory {
		m = medium{kind: inMemory, name: v1.StorageMediumMemory, size: memorySize}
	}
	if err := w.p.setUpAt(ctx, at, m, vol, false); err != nil {
		return "", fmt.Errorf("setting up the directory of %s volume %q of pod %s: %w", w.p.name, vol.SpecName, vol.Pod, err)
	}
	return at.abs, nil
}

// TearDown takes down pod uid's volume specName from its path alone: its
// ready file, its tmpfs, its directory and everything in it (see the
// emptyDir plugin's TearDown). Idempotent.
func (w *Wrapper) TearDown(ctx context.Context, uid types.UID, specName string) error {
	at, err := w.p.volumePaths(uid, specName)
	if err == nil {
		err = w.p.tearDownAt(ctx, at)
	}
	if err != nil {
		return fmt.Errorf("tearing down %s volume %q of pod with UID %s: %w", w.p.name, specName, uid, err)
	}
	return nil
}

// Reconstruct returns the volumes of the wrapped plugin that earlier runs
// left, as the emptyDir plugin's Reconstruct does (with the wrapped
// plugin's names and layout), every one Uncertain: the ready file and the
// tmpfs do not tell that the wrapped plugin's files were all written, so
// its SetUp runs again for a pod that still wants the volume.
func (w *Wrapper) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	return w.p.Reconstruct(ctx, rc)
}

// Retake is the emptyDir plugin's Retake for the wrapped plugin's
// directories.
func (w *Wrapper) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	return w.p.Retake(ctx, dir, mounted)
}
