package volumemanager

import (
	"context"

	"k8s.io/apimachinery/pkg/labels"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// republish publishes again, with NodePublishVolume, every mounted volume
// of a driver whose CSIDriver sets requiresRepublish, for each pod that
// still wants it, as the kubelet does at each pod sync: such drivers
// (secrets, service account tokens) refresh what they put into the volume.
// It runs at each resync; a volume busy with another operation is skipped
// until the next. A failed republish leaves the volume mounted.
func republish(ctx context.Context, csiDrivers storagelisters.CSIDriverLister, dsw *cache.DesiredStateOfWorld, asw *cache.ActualStateOfWorld, rec *reconciler) {
	drivers, err := csiDrivers.List(labels.Everything())
	if err != nil {
		return
	}
	wants := map[string]bool{}
	for _, d := range drivers {
		if d.Spec.RequiresRepublish != nil && *d.Spec.RequiresRepublish {
			wants[d.Name] = true
		}
	}
	if len(wants) == 0 {
		return
	}
	for driver := range wants {
		for _, name := range dsw.VolumesOfDriver(driver) {
			spec, desired, wanted := dsw.Volume(name)
			actual, known := asw.Volume(name)
			if !wanted || !known {
				continue
			}
			for _, pv := range desired {
				if pm, ok := actual.Pods[pv.Pod.UID]; ok && pm.State == cache.Mounted {
					rec.start(ctx, name, spec, actual, oe.Action{Kind: oe.OpPublish, Volume: name, Pod: pv}, nil)
				}
			}
		}
	}
}
