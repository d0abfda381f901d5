package reconciler

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// runningOps holds the operations in flight and when each started, by
// volume, for the wait errors. The loop writes it where it writes its
// in-flight map (begin, apply); waiters read it.
type runningOps struct {
	mu  sync.Mutex
	ops map[podvol.UniqueVolumeName]map[oe.Key]RunningOp
}

// RunningOp is one operation in flight.
type RunningOp struct {
	// Name is the call it makes, in its plugin's words (the CSI plugin's
	// "NodePublishVolume"), or the kubelet's words for the step
	// ("MountVolume.SetUp"): see callName.
	Name string
	// Since is when the loop started it (it may have waited for one of
	// Config.MaxConcurrentOperations' slots before calling the driver).
	Since time.Time
}

// callName says what operation a on spec calls, for the wait errors: the
// call's own name when its plugin gives one (volume.CallNamer: the CSI
// plugin's RPCs), else the kubelet's words for the step
// ("MountVolume.SetUp" of an emptyDir). The volume manager names no kind.
func callName(plugins *volume.Registry, a oe.Action, spec *podvol.VolumeSpec) string {
	if plugins == nil {
		return a.Kind.Step(spec.Mode)
	}
	if p, err := plugins.ForVolume(a.Volume); err == nil {
		if n, ok := p.(volume.CallNamer); ok {
			if name := n.CallName(a.Kind.Method(), spec); name != "" {
				return name
			}
		}
	}
	return a.Kind.Step(spec.Mode)
}

// Describe says how long the operation has been running at now.
func (o RunningOp) Describe(now time.Time) string {
	return fmt.Sprintf("%s still running after %s", o.Name, now.Sub(o.Since).Round(time.Millisecond))
}

// start records that operation a, described as name (callName), started
// at now.
func (r *runningOps) start(a oe.Action, name string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = map[podvol.UniqueVolumeName]map[oe.Key]RunningOp{}
	}
	if r.ops[a.Volume] == nil {
		r.ops[a.Volume] = map[oe.Key]RunningOp{}
	}
	r.ops[a.Volume][a.Key()] = RunningOp{Name: name, Since: now}
}

func (r *runningOps) done(a oe.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ops := r.ops[a.Volume]; ops != nil {
		delete(ops, a.Key())
		if len(ops) == 0 {
			delete(r.ops, a.Volume)
		}
	}
}

// all returns one operation in flight of each volume that has one: the
// one on the whole volume, else the one that started first.
func (r *runningOps) all() map[podvol.UniqueVolumeName]RunningOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[podvol.UniqueVolumeName]RunningOp, len(r.ops))
	for name, ops := range r.ops {
		if op, ok := ops[oe.Key{Volume: name}]; ok {
			out[name] = op
			continue
		}
		for _, op := range ops {
			if cur, ok := out[name]; !ok || op.Since.Before(cur.Since) || (op.Since.Equal(cur.Since) && op.Name < cur.Name) {
				out[name] = op
			}
		}
	}
	return out
}

// of returns the operation that a pod's use of a volume waits for: one on
// the pod's mount of it, else one on the whole volume.
func (r *runningOps) of(name podvol.UniqueVolumeName, uid types.UID) (RunningOp, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops[name]
	if op, ok := ops[oe.Key{Volume: name, Pod: uid}]; ok {
		return op, true
	}
	op, ok := ops[oe.Key{Volume: name}]
	return op, ok
}
