package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// The manager reaches a kind of volume only through the contract: a kind
// it has never heard of is expanded because it is a volume.Expander, has
// its objects held and its volumes published again on their change because
// it is a volume.ObjectReader, and its errors mean what the contract's
// classes say.

// growPlugin is a kind that is not CSI and grows its volumes on the node:
// it claims NFS PersistentVolumes (in place of the default nfs plugin) and
// answers NodeExpand with err.
type growPlugin struct {
	mu       sync.Mutex
	expanded []int64
	err      error
}

const growPluginName = "example.com/grow"

func (p *growPlugin) Name() string                                        { return growPluginName }
func (p *growPlugin) CanSupport(v *v1.Volume) bool                        { return v.NFS != nil }
func (p *growPlugin) CanSupportPV(pv *v1.PersistentVolume) bool           { return pv.Spec.NFS != nil }
func (p *growPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p *growPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{}, nil
}

func (p *growPlugin) SetUp(_ context.Context, req volume.MountRequest) (string, error) {
	return "/mnt/grow/" + req.Volume.SpecName, nil
}

func (p *growPlugin) NodeExpand(_ context.Context, req volume.ExpandRequest) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expanded = append(p.expanded, req.Size)
	return p.err == nil, p.err
}

func (p *growPlugin) sizes() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.expanded)
}

var (
	_ volume.PVPlugin = (*growPlugin)(nil)
	_ volume.Expander = (*growPlugin)(nil)
)

// TestExpandThroughContract: a claim of a volume of a kind that is not
// CSI, grown by the controller, is expanded on the node through the
// kind's volume.Expander, and the claim records what the kind's answer
// means in the contract's classes: grown, or refused as infeasible
// (volume.ErrInfeasible), not retried.
func TestExpandThroughContract(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		claim func(*v1.PersistentVolumeClaim) bool
	}{
		{"grown", nil, func(c *v1.PersistentVolumeClaim) bool {
			got := c.Status.Capacity[v1.ResourceStorage]
			return got.Cmp(resource.MustParse("2Gi")) == 0 && len(c.Status.Conditions) == 0
		}},
		{"infeasible", fmt.Errorf("growing share: too big: %w", volume.ErrInfeasible), func(c *v1.PersistentVolumeClaim) bool {
			return c.Status.AllocatedResourceStatuses[v1.ResourceStorage] == v1.PersistentVolumeClaimNodeResizeInfeasible
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			grow := &growPlugin{err: tt.err}
			e := newEnv(t, envOptions{plugins: []volume.Plugin{grow}, clusterInformers: true})
			pvc, pv := csitest.BoundClaim("ns", "share", csitest.PVSpec{Driver: "unused", Handle: "unused", Capacity: "1Gi"})
			pv.Spec.CSI, pv.Spec.NFS = nil, &v1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}
			e.create(pvc, pv)
			pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "share"}}})
			if err := e.mount(pod, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if got := grow.sizes(); len(got) != 0 {
				t.Fatalf("expanded %v before any resize", got)
			}

			ctx := context.Background()
			pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
			if _, err := e.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
			if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the claim records the expansion", func() bool {
				c, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "share", metav1.GetOptions{})
				return err == nil && tt.claim(c)
			})
			eventually(t, "idle", e.vm.idle)
			if got, want := grow.sizes(), []int64{2 << 30}; !slices.Equal(got, want) {
				t.Errorf("NodeExpand sizes = %v, want %v (once: a refusal is not retried)", got, want)
			}
		})
	}
}

// settingsPlugin is a kind that is not one of nodevol's and reads an API
// object: its pod volumes (NFS sources, in place of the default nfs
// plugin) read the ConfigMap named by the server, and are published again
// when it changes (Republish).
type settingsPlugin struct {
	mu     sync.Mutex
	setups int
}

func (p *settingsPlugin) Name() string                                        { return "example.com/settings" }
func (p *settingsPlugin) CanSupport(v *v1.Volume) bool                        { return v.NFS != nil }
func (p *settingsPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p *settingsPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true}, nil
}

func (p *settingsPlugin) SetUp(_ context.Context, req volume.MountRequest) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setups++
	return "/mnt/settings/" + req.Volume.SpecName, nil
}

func (p *settingsPlugin) Objects(namespace string, v *v1.Volume) []objectcache.Ref {
	if v.NFS == nil {
		return nil
	}
	return []objectcache.Ref{{Kind: objectcache.ConfigMap, Namespace: namespace, Name: v.NFS.Server}}
}

func (p *settingsPlugin) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setups
}

var _ volume.ObjectReader = (*settingsPlugin)(nil)

// TestObjectsThroughContract: the objects a kind's volumes read
// (volume.ObjectReader) are held by the pod for as long as it is known,
// and a change of one publishes the pod's volume again.
func TestObjectsThroughContract(t *testing.T) {
	settings := &settingsPlugin{}
	e := newEnv(t, envOptions{plugins: []volume.Plugin{settings}, resyncPeriod: time.Hour})
	ctx := context.Background()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"v": "1"}}
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "conf", Source: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "settings", Path: "/"}}},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ref := objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "settings"}
	if got := e.vm.objects.Holders(ref); !slices.Contains(got, resolve.PodHolder(pod.UID)) {
		t.Fatalf("holders of %s = %v, want pod %s", ref, got, pod.UID)
	}
	eventually(t, "the object cache watching configMap ns/settings", func() bool { return watching(e.client, "configmaps", "ns", "settings") })
	before := settings.count()

	cm.Data["v"] = "2"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume published again on the change", func() bool { return settings.count() > before })

	e.unmount(pod)
	eventually(t, "the object let go with the pod", func() bool { return !slices.Contains(e.vm.objects.Holders(ref), resolve.PodHolder(pod.UID)) })
}

// TestClassifyExpandError: what a plugin's failed node expansion means for
// the claim, read from the contract's error classes alone.
func TestClassifyExpandError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want expandFailure
	}{
		{"in progress", fmt.Errorf("call: %w", volume.ErrInProgress), expandTransient},
		{"not ready", fmt.Errorf("driver d: %w", volume.ErrNotReady), expandTransient},
		{"infeasible", fmt.Errorf("too big: %w", volume.ErrInfeasible), expandInfeasible},
		{"not while in use", fmt.Errorf("offline only: %w", volume.ErrNotWhileInUse), expandInUse},
		{"anything else", errors.New("resize2fs crashed"), expandFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifyExpandError(tt.err); got != tt.want {
				t.Errorf("classifyExpandError(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
