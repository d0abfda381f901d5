package driver

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// faultPoint says where in an RPC a fault fires.
type faultPoint string

const (
	// atStart fires before the RPC does anything.
	atStart faultPoint = "start"
	// atMid fires after the RPC has done part of its work and before it
	// has recorded it: for NodeStageVolume after attaching the loop
	// device, for NodePublishVolume after the mount (of an inline
	// ephemeral volume: once it is made and mounted), for CreateVolume
	// after writing the image, for NodeUnstageVolume after the unmount.
	// RPCs without such a point fire atMid faults at the start.
	atMid faultPoint = "mid"
)

// fault is one injected failure, for tests of what callers do when a
// driver misbehaves. The --fault flag takes one in the syntax String gives.
type fault struct {
	// Method is the RPC name without service, e.g. "NodeStageVolume".
	Method string
	// VolumeID limits the fault to one volume; empty means every volume.
	VolumeID string
	// At is where the fault fires; empty means atStart, or atMid for Exit.
	At faultPoint
	// Delay sleeps (or until the RPC's context ends) before going on.
	Delay time.Duration
	// Code, if not OK, fails the RPC with this gRPC code.
	Code codes.Code
	// Exit ends the process at once with exit code 3, leaving whatever
	// the RPC had done so far in place: a crash.
	Exit bool
	// Times is how often the fault fires; 0 means always.
	Times int
}

// parseFault parses the --fault flag syntax:
//
//	METHOD[/VOLUMEID]:ACTION[,ACTION...]
//
// where each ACTION is delay=DURATION, error=CODE (a gRPC code name such
// as Unavailable), exit, at=start|mid or times=N. Examples:
// "NodeStageVolume:delay=3s", "NodePublishVolume:error=Unavailable,times=1",
// "NodeStageVolume/vol1:exit".
func parseFault(s string) (fault, error) {
	target, actions, ok := strings.Cut(s, ":")
	if !ok || actions == "" {
		return fault{}, fmt.Errorf("fault %q: want METHOD[/VOLUMEID]:ACTION[,ACTION...]", s)
	}
	var f fault
	f.Method, f.VolumeID, _ = strings.Cut(target, "/")
	if f.Method == "" {
		return fault{}, fmt.Errorf("fault %q: no method", s)
	}
	for a := range strings.SplitSeq(actions, ",") {
		key, val, _ := strings.Cut(a, "=")
		switch key {
		case "delay":
			d, err := time.ParseDuration(val)
			if err != nil || d < 0 {
				return fault{}, fmt.Errorf("fault %q: bad delay %q", s, val)
			}
			f.Delay = d
		case "error":
			c, ok := codeByName[strings.ToLower(val)]
			if !ok || c == codes.OK {
				return fault{}, fmt.Errorf("fault %q: unknown gRPC code %q", s, val)
			}
			f.Code = c
		case "exit":
			f.Exit = true
		case "at":
			if val != string(atStart) && val != string(atMid) {
				return fault{}, fmt.Errorf("fault %q: at must be start or mid, not %q", s, val)
			}
			f.At = faultPoint(val)
		case "times":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return fault{}, fmt.Errorf("fault %q: bad times %q", s, val)
			}
			f.Times = n
		default:
			return fault{}, fmt.Errorf("fault %q: unknown action %q", s, a)
		}
	}
	if f.Delay == 0 && f.Code == codes.OK && !f.Exit {
		return fault{}, fmt.Errorf("fault %q: needs delay, error or exit", s)
	}
	if f.At == "" {
		f.At = atStart
		if f.Exit {
			f.At = atMid
		}
	}
	return f, nil
}

// String formats f in the --fault flag's syntax.
func (f fault) String() string {
	var b strings.Builder
	b.WriteString(f.Method)
	if f.VolumeID != "" {
		b.WriteString("/" + f.VolumeID)
	}
	var acts []string
	if f.Delay > 0 {
		acts = append(acts, "delay="+f.Delay.String())
	}
	if f.Code != codes.OK {
		acts = append(acts, "error="+f.Code.String())
	}
	if f.Exit {
		acts = append(acts, "exit")
	}
	if f.At != "" {
		acts = append(acts, "at="+string(f.At))
	}
	if f.Times > 0 {
		acts = append(acts, "times="+strconv.Itoa(f.Times))
	}
	return b.String() + ":" + strings.Join(acts, ",")
}

var codeByName = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[strings.ToLower(c.String())] = c
	}
	return m
}()

// faults fires the configured faults and the in-process hook.
type faults struct {
	hook func(ctx context.Context, method, volumeID string, at faultPoint) error
	exit func(code int)

	mu    sync.Mutex
	list  []fault
	fired []int
}

// fire runs every fault matching (method, volumeID, at), in order.
func (f *faults) fire(ctx context.Context, method, volumeID string, at faultPoint) error {
	if f.hook != nil {
		if err := f.hook(ctx, method, volumeID, at); err != nil {
			return err
		}
	}
	for i := range f.list {
		ft, ok := f.take(i, method, volumeID, at)
		if !ok {
			continue
		}
		logger := klog.FromContext(ctx)
		logger.Info("Injecting fault", "fault", ft.String(), "volumeID", volumeID)
		if ft.Delay > 0 {
			t := time.NewTimer(ft.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		if ft.Exit {
			klog.Flush()
			f.exit(3)
		}
		if ft.Code != codes.OK {
			return status.Errorf(ft.Code, "injected fault %s for volume %q", ft, volumeID)
		}
	}
	return nil
}

// take reports whether fault i applies now and counts it as fired.
func (f *faults) take(i int, method, volumeID string, at faultPoint) (fault, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ft := f.list[i]
	if ft.Method != method || (ft.VolumeID != "" && ft.VolumeID != volumeID) || ft.At != at {
		return ft, false
	}
	if ft.Times > 0 && f.fired[i] >= ft.Times {
		return ft, false
	}
	f.fired[i]++
	return ft, true
}
