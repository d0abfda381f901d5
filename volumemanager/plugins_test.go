package volumemanager

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/image"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// nfsPlugin is an embedder's plugin for nfs pod volumes that records its
// calls: "setup uid/spec server" and "teardown uid/spec".
type nfsPlugin struct {
	name string
	mu   sync.Mutex
	log  []string
}

func (p *nfsPlugin) Name() string                 { return p.name }
func (p *nfsPlugin) CanSupport(v *v1.Volume) bool { return v.NFS != nil }
func (p *nfsPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{}, nil
}

func (p *nfsPlugin) SetUp(_ context.Context, req volume.MountRequest) (string, error) {
	p.record("setup " + string(req.Volume.Pod.UID) + "/" + req.Volume.SpecName + " " + req.Spec.Source.NFS.Server)
	return "/mnt/nfs/" + req.Volume.SpecName, nil
}

func (p *nfsPlugin) TearDown(_ context.Context, req volume.MountRequest) error {
	p.record("teardown " + string(req.Volume.Pod.UID) + "/" + req.Volume.SpecName)
	return nil
}

func (p *nfsPlugin) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, s)
}

func (p *nfsPlugin) calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// TestResolveByPlugin: each pod volume a container uses is resolved by
// the plugin the registry finds for its source; a kind no plugin handles
// is a final error naming the volume and its kind (never skipped: the pod
// would be reported mounted without it), as is a source two plugins claim.
func TestResolveByPlugin(t *testing.T) {
	claim := boundClaim("ns", "claim", "pv-1")
	src := map[string]v1.VolumeSource{
		"data":    {PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}},
		"tools":   {Image: &v1.ImageVolumeSource{Reference: "registry.example/tools:1"}},
		"share":   {NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}},
		"scratch": {EmptyDir: &v1.EmptyDirVolumeSource{}},
		"config":  {ConfigMap: &v1.ConfigMapVolumeSource{}},
		"repo":    {ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "t", IQN: "i"}},
		"none":    {},
	}
	greedy := fakeClaimant{name: "example.com/greedy", claim: func(v *v1.Volume) bool { return v.NFS != nil && v.NFS.Server == "nfs.example" }}
	tests := []struct {
		name    string
		plugins []volume.Plugin // beside CSI and image
		vols    []string
		want    map[string]string // resolved: spec name -> unique name
		errs    map[string]string // spec name -> part of the error
	}{
		{
			name: "CSI and image", vols: []string{"data", "tools"},
			want: map[string]string{"data": "kubernetes.io/csi/csi.example.com^h-1", "tools": "kubernetes.io/image/uid-1-tools"},
		},
		{
			name: "kinds no plugin handles", vols: []string{"data", "config", "share", "repo", "none"},
			want: map[string]string{"data": "kubernetes.io/csi/csi.example.com^h-1"},
			errs: map[string]string{
				"config": `volume "config" of kind configMap: no volume plugin handles it`,
				"share":  `volume "share" of kind nfs: no volume plugin handles it`,
				"repo":   `volume "repo" of kind iscsi: no volume plugin handles it`,
				"none":   `volume "none" of kind no source: no volume plugin handles it`,
			},
		},
		{
			name: "an embedder's plugin", plugins: []volume.Plugin{&nfsPlugin{name: "example.com/nfs"}}, vols: []string{"share", "repo"},
			want: map[string]string{"share": "example.com/nfs/uid-1-share"},
			errs: map[string]string{"repo": `volume "repo" of kind iscsi: no volume plugin handles it`},
		},
		{
			name: "two plugins claim a source", plugins: []volume.Plugin{&nfsPlugin{name: "example.com/nfs"}, greedy}, vols: []string{"share"},
			errs: map[string]string{"share": `pod ns/pod-uid-1 volume "share": volume "share" of kind nfs: claimed by more than one volume plugin (example.com/greedy, example.com/nfs)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plugins, err := volume.NewRegistry(append([]volume.Plugin{newCSIPlugin(os.TempDir()), image.New()}, tt.plugins...)...)
			if err != nil {
				t.Fatal(err)
			}
			r := testResolver(t, claim, csiPV("pv-1", "csi.example.com", "h-1", claim))
			r.Plugins = plugins
			var vols []v1.Volume
			for _, name := range tt.vols {
				vols = append(vols, v1.Volume{Name: name, VolumeSource: src[name]})
			}
			pod := podWithVolumes("uid-1", "ns", vols...)
			_, _, resolved, errs := r.ResolvePod(pod)
			got := map[string]string{}
			for _, dv := range resolved {
				got[dv.Volume.SpecName] = string(dv.Spec.Name)
				if p := dv.Spec.Plugin; p != "" && (!dv.Spec.Ephemeral || dv.Spec.Source == nil || !strings.HasPrefix(string(dv.Spec.Name), p+"/")) {
					t.Errorf("%s: spec of plugin %s = %+v, want pod-scoped (Ephemeral) with its source", dv.Volume.SpecName, p, dv.Spec)
				}
			}
			if !mapsEqual(got, tt.want) {
				t.Errorf("resolved = %v, want %v", got, tt.want)
			}
			if len(errs) != len(tt.errs) {
				t.Errorf("errors = %v, want %v", errs, tt.errs)
			}
			for name, want := range tt.errs {
				if err := errs[name]; err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, planner.ErrUnknownSource) {
					t.Errorf("error of %s = %v, want %q wrapping ErrUnknownSource", name, err, want)
				}
			}
		})
	}
}

// fakeClaimant claims what claim says yes to and does nothing.
type fakeClaimant struct {
	name  string
	claim func(*v1.Volume) bool
}

func (f fakeClaimant) Name() string                 { return f.name }
func (f fakeClaimant) CanSupport(v *v1.Volume) bool { return f.claim(v) }
func (f fakeClaimant) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{}, nil
}
func (f fakeClaimant) SetUp(context.Context, volume.MountRequest) (string, error) { return "", nil }
func (f fakeClaimant) TearDown(context.Context, volume.MountRequest) error        { return nil }

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestNewRefusesSourcesClaimedTwice: a kind of pod volume source that two
// of the embedder's plugins claim is an error at New, naming both; so is a
// plugin whose name clashes with the CSI plugin's.
func TestNewRefusesSourcesClaimedTwice(t *testing.T) {
	for _, tt := range []struct {
		name    string
		plugins []volume.Plugin
		want    string
	}{
		{"two nfs plugins", []volume.Plugin{&nfsPlugin{name: "example.com/nfs"}, &nfsPlugin{name: "example.com/nfs2"}},
			"pod volumes of kind nfs are claimed by more than one volume plugin (example.com/nfs, example.com/nfs2)"},
		{"the CSI plugin's name", []volume.Plugin{&nfsPlugin{name: "kubernetes.io/csi"}}, "clashes with plugin kubernetes.io/csi"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), Plugins: tt.plugins})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestEmbedderPluginReplacesDefault: an embedder's plugin that claims a
// kind a built-in plugin handles (or takes its name) replaces it.
func TestEmbedderPluginReplacesDefault(t *testing.T) {
	images := fakeClaimant{name: "example.com/image", claim: func(v *v1.Volume) bool { return v.Image != nil }}
	for _, tt := range []struct {
		name string
		own  volume.Plugin
		src  v1.VolumeSource
	}{
		{"a kind in common", images, v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "r"}}},
		{"the same name", &nfsPlugin{name: image.PluginName}, v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example"}}},
		{"hostPath", fakeClaimant{name: "example.com/host", claim: func(v *v1.Volume) bool { return v.HostPath != nil }}, v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), Plugins: []volume.Plugin{tt.own}})
			if err != nil {
				t.Fatal(err)
			}
			p, err := vm.volumes.ForSource(&v1.Volume{Name: "v", VolumeSource: tt.src})
			if err != nil || p.Name() != tt.own.Name() {
				t.Errorf("ForSource = %v, %v; want the embedder's %s", p, err, tt.own.Name())
			}
		})
	}
}

// mountedNames are the spec names GetMountedVolumesForPod lists, sorted.
func mountedNames(vm *VolumeManager, uid types.UID) []string {
	var out []string
	for _, v := range vm.GetMountedVolumesForPod(uid) {
		out = append(out, v.SpecName)
	}
	slices.Sort(out)
	return out
}

// TestImageVolume: an image volume is waited for and listed mounted like
// any other, but nothing is attached, staged or published for it on the
// node and it is not reported in use; it goes with its pod.
func TestImageVolume(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
		{Name: "tools", Source: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry.example/tools:1"}}, ReadOnly: true},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := mountedNames(e.vm, pod.UID), []string{"data", "tools"}; !slices.Equal(got, want) {
		t.Errorf("mounted = %q, want %q", got, want)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 1 {
		t.Errorf("NodePublishVolume calls = %d, want 1 (the claim's only)", got)
	}
	if stats, err := e.vm.GetVolumeStats(context.Background(), pod.UID); err != nil || len(stats) > 1 {
		t.Errorf("GetVolumeStats = %v, %v; want no error and no stats of the image volume", stats, err)
	}
	for _, n := range e.vm.GetVolumesInUse() {
		if strings.HasPrefix(string(n), image.PluginName+"/") {
			t.Errorf("GetVolumesInUse lists image volume %s", n)
		}
	}
	e.unmount(pod)
	if got := mountedNames(e.vm, pod.UID); len(got) != 0 {
		t.Errorf("mounted after unmount = %q", got)
	}
}

// TestEmbedderPlugin: a plugin in Config.Plugins sets up and tears down
// the pod volumes whose source it claims, given that source.
func TestEmbedderPlugin(t *testing.T) {
	nfs := &nfsPlugin{name: "example.com/nfs"}
	e := newEnv(t, envOptions{plugins: []volume.Plugin{nfs}})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "share", Source: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}}},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mounted := e.vm.GetMountedVolumesForPod(pod.UID)
	if len(mounted) != 1 || mounted[0].SpecName != "share" || mounted[0].Path != "/mnt/nfs/share" {
		t.Errorf("mounted = %+v, want share at /mnt/nfs/share", mounted)
	}
	e.unmount(pod)
	want := []string{"setup " + string(pod.UID) + "/share nfs.example", "teardown " + string(pod.UID) + "/share"}
	if got := nfs.calls(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// TestImageVolumeAfterRestart: an image volume leaves nothing on disk, so
// after a restart nothing of it is found, and the pod added again gets it
// mounted at once beside its claim's volume, found on disk; nothing is
// left Uncertain.
func TestImageVolumeAfterRestart(t *testing.T) {
	e := newEnv(t, envOptions{})
	pvName := e.claim("data")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
		{Name: "tools", Source: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry.example/tools:1"}}, ReadOnly: true},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.stop()

	ctx := context.Background()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := e.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, envOptions{root: e.root, objects: []runtime.Object{pvc, pv}})
	eventually(t, "reconstruction", e2.vm.statesSynced.Load)
	for _, n := range e2.vm.asw.VolumeNames() {
		if strings.HasPrefix(string(n), image.PluginName+"/") {
			t.Errorf("found on disk: image volume %s", n)
		}
	}
	if err := e2.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e2.vm.MarkPodsSynced()
	if got, want := mountedNames(e2.vm, pod.UID), []string{"data", "tools"}; !slices.Equal(got, want) {
		t.Errorf("mounted = %q, want %q", got, want)
	}
	eventually(t, "nothing uncertain", func() bool {
		for _, n := range e2.vm.asw.VolumeNames() {
			v, _ := e2.vm.asw.Volume(n)
			for _, pm := range v.Pods {
				if pm.State != podvol.Mounted {
					return false
				}
			}
		}
		return e2.vm.idle()
	})
}

// leavingNFS is nfsPlugin leaving on disk what it set up: its Reconstruct
// gives back found, its Retake is never asked (nothing unreadable).
type leavingNFS struct {
	*nfsPlugin
	found volume.Found
}

func (p leavingNFS) Reconstruct(context.Context, volume.Recovery) volume.Found { return p.found }
func (p leavingNFS) Retake(context.Context, string, map[string]bool) bool      { return false }

// TestReconstructPerPlugin: at start each plugin that is a
// volume.Reconstructor is asked what earlier runs left; what an
// embedder's plugin found is installed beside the CSI plugin's and torn
// down through it once the pods are synced and none wants it.
func TestReconstructPerPlugin(t *testing.T) {
	nfs := &nfsPlugin{name: "example.com/nfs"}
	spec := podvol.VolumeSpec{Name: "example.com/nfs/uid-gone-share", Plugin: "example.com/nfs", Ephemeral: true, Mode: podvol.Filesystem,
		Source: &v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}}}
	found := volume.Found{Attempted: 1, Mounts: []volume.FoundMount{{
		Spec: spec, Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-gone"}, SpecName: "share"}, Path: "/mnt/nfs/share", State: podvol.Uncertain,
	}}}
	e := newEnv(t, envOptions{plugins: []volume.Plugin{leavingNFS{nfsPlugin: nfs, found: found}}})
	eventually(t, "reconstruction", e.vm.statesSynced.Load)
	if v, ok := e.vm.asw.Volume(spec.Name); !ok || v.Pods["uid-gone"].State != podvol.Uncertain {
		t.Fatalf("actual state of %s = %+v, %v; want the pod mount found, Uncertain", spec.Name, v, ok)
	}
	if got := nfs.calls(); len(got) != 0 {
		t.Errorf("calls before MarkPodsSynced = %q, want none: what was found is held", got)
	}
	e.vm.MarkPodsSynced()
	eventually(t, "the found mount torn down", func() bool { return slices.Equal(nfs.calls(), []string{"teardown uid-gone/share"}) })
}
