package volumemanager

import (
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// conditions remembers which pod mounts were last seen with an abnormal
// volume condition, so that the VolumeConditionAbnormal event is recorded
// once when a volume turns abnormal, not at every stats call (older
// kubelets recorded it at each stats period while the volume stayed
// abnormal). The kubelet v1.37 records no such event any more (its
// CSIVolumeHealth reports conditions in the pod's status instead); nodevol
// keeps it for embedders without that status, in the words the kubelet
// used ("Volume <pod's volume name>: <the driver's message>").
type conditions struct {
	events record.EventRecorder // nil: no events

	mu       sync.Mutex
	abnormal map[oe.Key]bool
}

// observe records the condition a pod's volume was found in, and an event
// on the pod when it has just turned abnormal. A nil condition (the driver
// reported none) changes nothing.
func (c *conditions) observe(name podvol.UniqueVolumeName, vol podvol.PodVolume, cond *volume.Condition) {
	if cond == nil {
		return
	}
	key := oe.Key{Volume: name, Pod: vol.Pod.UID}
	c.mu.Lock()
	was := c.abnormal[key]
	switch {
	case cond.Abnormal && !was:
		if c.abnormal == nil {
			c.abnormal = map[oe.Key]bool{}
		}
		c.abnormal[key] = true
	case !cond.Abnormal && was:
		delete(c.abnormal, key)
	}
	c.mu.Unlock()
	if cond.Abnormal && !was && c.events != nil && vol.Pod.Name != "" {
		ref := reconciler.PodObjectRef(vol.Pod)
		c.events.Event(ref, v1.EventTypeWarning, "VolumeConditionAbnormal", fmt.Sprintf("Volume %s: %s", vol.SpecName, cond.Message))
	}
}

// forgetGone drops what is remembered of the pod mounts no longer Mounted.
func (c *conditions) forgetGone(asw *state.ActualStateOfWorld) {
	keep := map[oe.Key]bool{}
	for _, name := range asw.VolumeNames() {
		if v, ok := asw.Volume(name); ok {
			for uid, pm := range v.Pods {
				if pm.State == podvol.Mounted {
					keep[oe.Key{Volume: name, Pod: uid}] = true
				}
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.abnormal {
		if !keep[k] {
			delete(c.abnormal, k)
		}
	}
}
