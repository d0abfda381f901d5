package volumemanager

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	coreinformers "k8s.io/client-go/informers/core/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/tools/cache"
)

// watch hooks the informers up: PVC and PV changes resolve the pods waiting
// for them again (and may make a node expansion due); VolumeAttachment and
// CSIDriver changes retry their volumes at once instead of waiting out a
// backoff. A list or watch error is remembered for the wait errors.
func (vm *VolumeManager) watch(core coreinformers.Interface, storage storageinformers.Interface) error {
	onClaim := func(obj any) {
		switch o := unwrap(obj).(type) {
		case *v1.PersistentVolumeClaim:
			vm.in.Claim(o.Namespace + "/" + o.Name)
		case *v1.PersistentVolume:
			if r := o.Spec.ClaimRef; r != nil {
				vm.in.Claim(r.Namespace + "/" + r.Name)
			}
		}
	}
	onAttachment := func(obj any) {
		if va, ok := unwrap(obj).(*storagev1.VolumeAttachment); ok && va.Spec.NodeName == vm.cfg.NodeName {
			vm.in.Attachment(va.Name) // the loop knows which volume waits for it
		}
	}
	onDriver := func(obj any) {
		if d, ok := unwrap(obj).(*storagev1.CSIDriver); ok {
			vm.in.Driver(d.Name)
			if vm.registration != nil { // its allocatable refresh period may have changed
				vm.registration.CSIDriverChanged(d.Name)
			}
		}
	}
	type watched struct {
		what string
		inf  cache.SharedIndexInformer
		fn   func(any)
	}
	hs := []watched{{"CSIDrivers", storage.CSIDrivers().Informer(), onDriver}}
	if vm.cfg.ClusterInformers { // else read one by one through the object cache (internal/resolve/holds.go)
		hs = append(hs,
			watched{"PersistentVolumeClaims", core.PersistentVolumeClaims().Informer(), onClaim},
			watched{"PersistentVolumes", core.PersistentVolumes().Informer(), onClaim},
			watched{"VolumeAttachments", storage.VolumeAttachments().Informer(), onAttachment})
	}
	for _, h := range hs {
		fn, what := h.fn, h.what
		// Fails only for an informer already started (Config.InformerFactory):
		// its errors are then not in the wait errors.
		_ = h.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			vm.listErrs.set(what, listError(what, err))
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { vm.listErrs.set(what, nil); fn(obj) },
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		if err != nil {
			return fmt.Errorf("adding informer handler: %w", err)
		}
		vm.syncs = append(vm.syncs, reg.HasSyncedChecker())
	}
	return nil
}

// listError is an informer's list or watch error, for the wait errors. A
// node's own credentials may not list claims, volumes or attachments (the
// Node authorizer): the error then says which mode works there.
func listError(what string, err error) error {
	if apierrors.IsForbidden(err) && what != "CSIDrivers" {
		return fmt.Errorf("%w (Config.ClusterInformers lists and watches every claim, volume and attachment; with a node's own credentials, "+
			"under the Node authorizer, leave it false: they are then read one at a time)", err)
	}
	return err
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// listErrors holds the last list or watch error of each informer.
type listErrors struct {
	mu   sync.Mutex
	errs map[string]error
}

func (l *listErrors) set(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		delete(l.errs, what)
		return
	}
	if l.errs == nil {
		l.errs = map[string]error{}
	}
	l.errs[what] = err
}

func (l *listErrors) get() map[string]error {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]error, len(l.errs))
	for k, v := range l.errs {
		out[k] = v
	}
	return out
}

// informersSynced reports whether every informer has listed once.
func (vm *VolumeManager) informersSynced() bool {
	for _, c := range vm.syncs {
		select {
		case <-c.Done():
		default:
			return false
		}
	}
	return true
}
