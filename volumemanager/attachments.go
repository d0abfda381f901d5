package volumemanager

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
)

// informerAttachments are the informers' attachments and volumes
// (Config.ClusterInformers).
type informerAttachments struct {
	storagelisters.VolumeAttachmentLister
	pvs corelisters.PersistentVolumeLister
}

func (l informerAttachments) Volume(name string) (*v1.PersistentVolume, error) {
	return l.pvs.Get(name)
}

// attachmentsOnce is the VolumeAttachments listed once at start, for
// adoptAttachments in self-attach mode without Config.ClusterInformers:
// no informer keeps every attachment of the cluster, and the node, which
// cannot name the attachments of volumes it no longer knows (after a
// reboot nothing of them is left on disk), finds its own in one list, and
// reads the volume of each with a GET. It
// is one of the manager's sync checkers: pods are resolved once it has
// listed (or been refused), as with the informers. Under the Node
// authorizer a node may not list them: nothing is adopted then.
type attachmentsOnce struct {
	client kubernetes.Interface
	node   string
	retry  backoff.Policy
	clock  clock.Clock
	errs   *listErrors
	done   chan struct{}
	// items are this node's attachments, volumes the volumes they
	// attach (by name; missing: not read), set before done is closed.
	items   []*storagev1.VolumeAttachment
	volumes map[string]*v1.PersistentVolume
}

func newAttachmentsOnce(client kubernetes.Interface, node string, c clock.Clock, errs *listErrors) *attachmentsOnce {
	return &attachmentsOnce{client: client, node: node, clock: c, errs: errs, done: make(chan struct{}),
		retry: backoff.Policy{Initial: time.Second, Max: 30 * time.Second, Jitter: backoff.APIJitter}}
}

// Name is the sync checker's name.
func (a *attachmentsOnce) Name() string { return "VolumeAttachments (listed once)" }

// Done is closed once the attachments are listed, or the list refused.
func (a *attachmentsOnce) Done() <-chan struct{} { return a.done }

// List returns this node's attachments (after Done).
func (a *attachmentsOnce) List(labels.Selector) ([]*storagev1.VolumeAttachment, error) {
	return a.items, nil
}

// Volume returns the volume of one of them (after Done).
func (a *attachmentsOnce) Volume(name string) (*v1.PersistentVolume, error) {
	if pv, ok := a.volumes[name]; ok {
		return pv, nil
	}
	return nil, fmt.Errorf("PersistentVolume %s was not read", name)
}

// run lists the attachments until one list answers, the API server
// refuses it (forbidden: logged, nothing adopted) or ctx ends; a failed
// list is in the wait errors until then and is retried with backoff.
func (a *attachmentsOnce) run(ctx context.Context) {
	const what = "VolumeAttachments"
	for failures := 0; ; failures++ {
		l, err := a.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		switch {
		case err == nil:
			a.keep(ctx, l.Items)
			a.errs.set(what, nil)
			close(a.done)
			return
		case apierrors.IsForbidden(err):
			klog.FromContext(ctx).Error(err, "Cannot list the VolumeAttachments: the attachments this node created in an earlier run whose volumes left nothing on disk are not detached (grant list on volumeattachments, or set Config.ClusterInformers)")
			close(a.done)
			return
		}
		a.errs.set(what, fmt.Errorf("listing the VolumeAttachments this node may have created in an earlier run: %w", err))
		select {
		case <-ctx.Done():
			return
		case <-a.clock.After(a.retry.Delay(failures + 1)):
		}
	}
}

// keep keeps this node's attachments of the list and reads the volume of
// each (a volume that cannot be read is left out: its attachment is then
// not adopted, as with the informers).
func (a *attachmentsOnce) keep(ctx context.Context, all []storagev1.VolumeAttachment) {
	a.volumes = map[string]*v1.PersistentVolume{}
	for i := range all {
		va := &all[i]
		pv := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName != a.node || pv == nil {
			continue
		}
		a.items = append(a.items, va)
		if got, err := a.client.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{}); err == nil {
			a.volumes[*pv] = got
		}
	}
}
