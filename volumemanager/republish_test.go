package volumemanager

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	testclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestRequiresRepublish: at each resync, the mounted volumes of a driver
// whose CSIDriver sets requiresRepublish are published again; those of
// other drivers are not.
func TestRequiresRepublish(t *testing.T) {
	again := csitest.New(t, csitest.Options{DriverName: "again.example.com", CreateTargetDirs: true, NoStageUnstage: true})
	once := csitest.New(t, csitest.Options{DriverName: "once.example.com", CreateTargetDirs: true, NoStageUnstage: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: again.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: once.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(
		csitest.CSIDriver(again.DriverName(), csitest.CSIDriverSpec{RequiresRepublish: true}),
		csitest.CSIDriver(once.DriverName(), csitest.CSIDriverSpec{}),
		pvcA, pvA, pvcB, pvB)
	clk := testclock.NewFakeClock(time.Now())
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Clock: clk, ResyncPeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, d := range []*csitest.Server{again, once} {
		if err := vm.Drivers().Register(ctx, d.DriverName(), d.Endpoint()); err != nil {
			t.Fatal(err)
		}
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "a", Claim: "a"}, {Name: "b", Claim: "b"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "resync ticker created", clk.HasWaiters)
	clk.Step(time.Minute)
	if err := again.WaitForCalls(ctx, "NodePublishVolume", 2); err != nil {
		t.Fatalf("requiresRepublish volume not published again: %v", err)
	}
	waitIdle(t, vm)
	if n := once.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("volume of a driver without requiresRepublish published %d times, want 1", n)
	}
	if vols := vm.GetMountedVolumesForPod(pod.UID); len(vols) != 2 {
		t.Errorf("mounted volumes after republish: %+v, want 2", vols)
	}
}

// adoptPlugin claims secret volumes, republishes them (as the kubelet
// remounts them), finds one pod's volume Mounted at start, as a secret
// tmpfs an earlier run left mounted, and counts its SetUps.
type adoptPlugin struct {
	pod    *v1.Pod
	mu     sync.Mutex
	setUps int
}

func (p *adoptPlugin) Name() string                 { return "example.com/secret" }
func (p *adoptPlugin) CanSupport(v *v1.Volume) bool { return v.Secret != nil }
func (p *adoptPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true}, nil
}
func (p *adoptPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p *adoptPlugin) SetUp(context.Context, volume.MountRequest) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setUps++
	return "/secret", nil
}
func (p *adoptPlugin) Reconstruct(context.Context, volume.Recovery) volume.Found {
	return volume.Found{Attempted: 1, Mounts: []volume.FoundMount{{
		Spec:   podvol.VolumeSpec{Name: podvol.UniqueVolumeName(p.Name() + "/" + string(p.pod.UID) + "-creds"), Plugin: p.Name(), Mode: podvol.Filesystem, Ephemeral: true},
		Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: p.pod.UID}, SpecName: "creds"},
		Path:   "/secret", State: podvol.Mounted,
	}}}
}
func (p *adoptPlugin) Retake(context.Context, string, map[string]bool) bool { return false }

func (p *adoptPlugin) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setUps
}

// TestRepublishAdopted: a volume of a republishing plugin that an earlier
// run left Mounted is published again when its pod is first added, as the
// kubelet remounts a pod's volumes at the pod's first sync, so that what
// changed while no one kept it current (a secret, the pod's labels, a
// token) reaches its files at once, not at the next resync (an hour away
// here); a second AddPod of the unchanged pod publishes nothing.
func TestRepublishAdopted(t *testing.T) {
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "creds", Source: v1.VolumeSource{
		Secret: &v1.SecretVolumeSource{SecretName: "db"}}}}})
	p := &adoptPlugin{pod: pod}
	e := newEnv(t, envOptions{plugins: []volume.Plugin{p}, resyncPeriod: time.Hour})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Mounted at once (adopted); set up again once the pod is resolved.
	eventually(t, "the adopted volume set up again", func() bool { return p.count() > 0 })
	waitIdle(t, e.vm)
	if n := p.count(); n != 1 {
		t.Fatalf("the adopted volume was set up %d times at the pod's first addition, want once", n)
	}
	if err := e.vm.UpdatePod(pod); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, e.vm)
	if n := p.count(); n != 1 {
		t.Errorf("set up %d times after the pod was added again unchanged, want once", n)
	}
}

// TestFailedRepublishKeepsVolume: a republish of a requiresRepublish
// driver that fails with a final error leaves the volume Mounted and the
// pod's volume directory as it was (the target the driver made without
// mounting, and vol_data.json), as the kubelet 1.37 leaves them on a
// remount; the next resync publishes it again.
func TestFailedRepublishKeepsVolume(t *testing.T) {
	drv := csitest.New(t, csitest.Options{DriverName: "again.example.com", CreateTargetDirs: true, NoStageUnstage: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{RequiresRepublish: true}), pvc, pv)
	clk := testclock.NewFakeClock(time.Now())
	root := t.TempDir()
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), Clock: clk, ResyncPeriod: time.Minute}, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "a", Claim: "a"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pv.Name)
	drv.Inject(csitest.Fault{Method: "NodePublishVolume", Err: status.Error(codes.InvalidArgument, "injected"), Times: 1})
	for i, want := range []int{2, 3} { // the failed republish, then one that succeeds
		eventually(t, "resync ticker created", clk.HasWaiters)
		clk.Step(time.Minute)
		if err := drv.WaitForCalls(ctx, "NodePublishVolume", want); err != nil {
			t.Fatalf("republish %d: %v", i+1, err)
		}
		waitIdle(t, vm)
		for _, p := range []string{filepath.Join(dir, "mount"), filepath.Join(dir, "vol_data.json")} {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("after republish %d: %v, want it kept", i+1, err)
			}
		}
		if vols := vm.GetMountedVolumesForPod(pod.UID); len(vols) != 1 {
			t.Errorf("after republish %d: mounted volumes %+v, want 1", i+1, vols)
		}
	}
}
