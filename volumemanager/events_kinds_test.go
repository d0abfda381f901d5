package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// failingMounter is the fake mounter, but for the mounts at a target
// ending with suffix, which fail with err, as mount(8) would.
type failingMounter struct {
	*mount.FakeMounter
	suffix string
	err    error
}

// newObjectRecorder is a FakeRecorder whose events name the kind of their
// object: "Warning FailedMount ... involvedObject{kind=Pod,apiVersion=v1}".
func newObjectRecorder(n int) *record.FakeRecorder {
	r := record.NewFakeRecorder(n)
	r.IncludeObject = true
	return r
}

func (m *failingMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	if m.suffix != "" && strings.HasSuffix(target, m.suffix) {
		return m.err
	}
	return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
}

// failingBlockMapper maps and unmaps nothing, and fails as told.
type failingBlockMapper struct{ mapErr, unmapErr error }

func (m *failingBlockMapper) Map(context.Context, blockdev.Map) error   { return m.mapErr }
func (m *failingBlockMapper) Unmap(context.Context, blockdev.Map) error { return m.unmapErr }

// TestKindEvents: for every kind of volume nodevol handles and every
// operation that can fail on the node, a manager on fakes (the in-process
// CSI driver, the fake mounter) records the event the kubelet v1.37.2
// records for the same failure, text for text: its reason, its step, the
// volume as it names it, the cause in its words. "{pv}" is the case's PV,
// "{drv}" the driver, "{host}" a directory of the host. The image kind has
// nothing that fails on the node (the runtime mounts it).
func TestKindEvents(t *testing.T) {
	const mountErr = "mount failed: exit status 32"
	claimWith := func(name string, spec csitest.PVSpec) func(drv, host string) []runtime.Object {
		return func(drv, _ string) []runtime.Object {
			spec.Driver, spec.Handle = drv, "handle-"+name
			pvc, pv := csitest.BoundClaim("ns", name, spec)
			return []runtime.Object{pvc, pv}
		}
	}
	claim := func(name string) func(drv, host string) []runtime.Object {
		return claimWith(name, csitest.PVSpec{})
	}
	blockClaim := claimWith("raw", csitest.PVSpec{Block: true})
	stageSecret := csitest.PVSpec{NodeStageSecret: &v1.SecretReference{Namespace: "ns", Name: "stage-secret"}}
	localPV := func(drv, host string) []runtime.Object {
		if err := os.Mkdir(filepath.Join(host, "local"), 0o755); err != nil {
			t.Fatal(err)
		}
		return localClaim(drv, host)
	}
	objects := func(objs ...runtime.Object) func(string, string) []runtime.Object {
		return func(string, string) []runtime.Object { return objs }
	}
	optional, mode := true, int32(0o644) // the API server's default
	cmVol := func(name string, items ...v1.KeyToPath) csitest.PodVolume {
		return csitest.PodVolume{Name: "cm", Source: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: name}, Items: items}}}
	}
	secretVol := func(name string, items ...v1.KeyToPath) csitest.PodVolume {
		return csitest.PodVolume{Name: "sec", Source: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: name, Items: items}}}
	}
	file := v1.HostPathDirectory
	tests := []struct {
		name      string
		objects   func(drv, host string) []runtime.Object
		pod       func(drv, host string) *v1.Pod
		noDriver  bool // no CSIDriver object
		faults    []csitest.Fault
		mountFail string // the suffix of the targets whose mounts fail
		mapper    *failingBlockMapper
		teardown  bool // mount, then delete the pod: its teardown fails
		want      string
	}{
		{name: "configMap missing", pod: podWith(cmVol("cm-missing")),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "cm" : configmap "cm-missing" not found involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "configMap key missing", objects: objects(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"a": "1"}}),
			pod:  podWith(cmVol("settings", v1.KeyToPath{Key: "nokey", Path: "f"})),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "cm" : configmap references non-existent config key: nokey involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "secret missing", pod: podWith(secretVol("s-missing")),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "sec" : secret "s-missing" not found involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "secret key missing", objects: objects(csitest.Secret("ns", "creds", map[string]string{"a": "1"})),
			pod:  podWith(secretVol("creds", v1.KeyToPath{Key: "nokey", Path: "f"})),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "sec" : references non-existent secret key: nokey involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "projected, two sources missing", objects: objects(crashNodeObject()),
			pod: podWith(csitest.PodVolume{Name: "proj", Source: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "pc"}}},
				{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "opt"}, Optional: &optional}},
				{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "ps"}}},
			}}}}),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "proj" : [configmap "pc" not found, secret "ps" not found] involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "downwardAPI, its tmpfs", objects: objects(crashNodeObject()), mountFail: "/kubernetes.io~downward-api/podinfo",
			pod: podWith(csitest.PodVolume{Name: "podinfo", Source: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{DefaultMode: &mode,
				Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}}),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "podinfo" : ` + mountErr + ` involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "emptyDir in memory", objects: objects(crashNodeObject()), mountFail: "/kubernetes.io~empty-dir/cache",
			pod:  podWith(withEmptyDir("cache", v1.StorageMediumMemory)),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "cache" : ` + mountErr + ` involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "emptyDir in hugepages, no hugepage request", pod: podWith(withEmptyDir("hp", "HugePages-2Mi")),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "hp" : medium HugePages-2Mi: hugePages storage requested, but there is no resource request for huge pages involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "emptyDir, unknown medium", pod: podWith(withEmptyDir("odd", "Tape")),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "odd" : unknown storage medium "Tape" involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "hostPath of another type",
			pod: func(_, host string) *v1.Pod {
				if err := os.WriteFile(filepath.Join(host, "f"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
					{Name: "host", Source: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: filepath.Join(host, "f"), Type: &file}}},
				}})
			},
			want: `Warning FailedMount MountVolume.SetUp failed for volume "host" : hostPath type check failed: {host}/f is not a directory, it's a File involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "local PV", objects: func(drv, host string) []runtime.Object { return append(localPV(drv, host), crashNodeObject()) },
			mountFail: "/kubernetes.io~local-volume/{pv}", pod: podWith(csitest.PodVolume{Name: "data", Claim: "local"}),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "{pv}" : ` + mountErr + ` involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI stage", objects: claim("data"), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}),
			faults: []csitest.Fault{{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "disk on fire")}},
			want:   `Warning FailedMount MountVolume.MountDevice failed for volume "{pv}" : rpc error: code = Internal desc = disk on fire involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI stage, its secret missing", objects: claimWith("data", stageSecret), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}),
			want: `Warning FailedMount MountVolume.MountDevice failed for volume "{pv}" : fetching NodeStageSecretRef ns/stage-secret failed: ` +
				`kubernetes.io/csi: failed to find the secret stage-secret in the namespace ns with error: secrets "stage-secret" not found involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI publish", objects: claim("data"), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}),
			faults: []csitest.Fault{{Method: "NodePublishVolume", Err: status.Error(codes.Internal, "no room")}},
			want:   `Warning FailedMount MountVolume.SetUp failed for volume "{pv}" : rpc error: code = Internal desc = no room involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI publish, its secret missing", objects: claimWith("data", csitest.PVSpec{NodePublishSecret: &v1.SecretReference{Namespace: "ns", Name: "pub"}}), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}),
			want: `Warning FailedMount MountVolume.SetUp failed for volume "{pv}" : fetching NodePublishSecretRef ns/pub failed: ` +
				`kubernetes.io/csi: failed to find the secret pub in the namespace ns with error: secrets "pub" not found involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI inline, no CSIDriver", noDriver: true, pod: func(drv, _ string) *v1.Pod {
			return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
				{Name: "inline", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: drv}}},
			}})
		},
			want: `Warning FailedMount MountVolume.SetUp failed for volume "inline" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: ` +
				`volume mode "Ephemeral" not supported by driver {drv} (no CSIDriver object) involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI inline, Persistent only", noDriver: true,
			objects: func(drv, _ string) []runtime.Object {
				return []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}})}
			},
			pod: func(drv, _ string) *v1.Pod {
				return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
					{Name: "inline", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: drv}}},
				}})
			},
			want: `Warning FailedMount MountVolume.SetUp failed for volume "inline" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: ` +
				`volume mode "Ephemeral" not supported by driver {drv} (only supports ["Persistent"]) involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI unpublish", objects: claim("data"), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}), teardown: true,
			faults: []csitest.Fault{{Method: "NodeUnpublishVolume", Err: status.Error(codes.Internal, "busy")}},
			want: `Warning FailedUnMount UnmountVolume.TearDown failed for volume "kubernetes.io/csi/{drv}^handle-data" : ` +
				`kubernetes.io/csi: Unmounter.TearDownAt failed: rpc error: code = Internal desc = busy involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI unstage", objects: claim("data"), pod: podWith(csitest.PodVolume{Name: "data", Claim: "data"}), teardown: true,
			faults: []csitest.Fault{{Method: "NodeUnstageVolume", Err: status.Error(codes.Internal, "busy")}},
			want: `Warning FailedUnMount UnmountDevice failed for volume "{pv}" : ` +
				`kubernetes.io/csi: attacher.UnmountDevice failed: rpc error: code = Internal desc = busy involvedObject{kind=Node,apiVersion=v1}`},
		{name: "CSI block stage", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}),
			faults: []csitest.Fault{{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "disk on fire")}},
			want:   `Warning FailedMapVolume MapVolume.SetUpDevice failed for volume "{pv}" : rpc error: code = Internal desc = disk on fire involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI block publish", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}),
			faults: []csitest.Fault{{Method: "NodePublishVolume", Err: status.Error(codes.Internal, "no such device")}},
			want:   `Warning FailedMapVolume MapVolume.MapPodDevice failed for volume "{pv}" : rpc error: code = Internal desc = no such device involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI block map", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}),
			mapper: &failingBlockMapper{mapErr: errors.New("losetup: no free loop device")},
			want:   `Warning FailedMapVolume MapVolume.MapBlockVolume failed for volume "{pv}" : losetup: no free loop device involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI block unmap", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}), teardown: true,
			mapper: &failingBlockMapper{unmapErr: errors.New("losetup -d: device busy")},
			want:   `Warning FailedUnmapDevice UnmapVolume.UnmapBlockVolume failed for volume "kubernetes.io/csi/{drv}^handle-raw" : losetup -d: device busy involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI block unpublish", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}), teardown: true,
			faults: []csitest.Fault{{Method: "NodeUnpublishVolume", Err: status.Error(codes.Internal, "busy")}},
			want: `Warning FailedUnmapDevice UnmapVolume.UnmapPodDevice failed for volume "kubernetes.io/csi/{drv}^handle-raw" : ` +
				`kubernetes.io/csi: blockMapper.unpublishVolumeForBlock failed: rpc error: code = Internal desc = busy involvedObject{kind=Pod,apiVersion=v1}`},
		{name: "CSI block unstage", objects: blockClaim, pod: podWith(csitest.PodVolume{Name: "dev", Claim: "raw", Block: true}), teardown: true,
			faults: []csitest.Fault{{Method: "NodeUnstageVolume", Err: status.Error(codes.Internal, "busy")}},
			want: `Warning FailedUnmapDevice UnmapDevice.TearDownDevice failed for volume "{pv}" : ` +
				`kubernetes.io/csi: blockMapper.unstageVolumeForBlock failed: rpc error: code = Internal desc = busy involvedObject{kind=Node,apiVersion=v1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
			host := t.TempDir()
			var objs []runtime.Object
			if !tt.noDriver {
				objs = append(objs, csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}))
			}
			if tt.objects != nil {
				objs = append(objs, tt.objects(drv.DriverName(), host)...)
			}
			pv := ""
			for _, o := range objs {
				if p, ok := o.(*v1.PersistentVolume); ok {
					pv = p.Name
				}
			}
			expand := strings.NewReplacer("{pv}", pv, "{drv}", drv.DriverName(), "{host}", host).Replace
			mounter := &failingMounter{FakeMounter: mount.NewFakeMounter(nil), suffix: expand(tt.mountFail), err: errors.New(mountErr)}
			mapper := tt.mapper
			if mapper == nil {
				mapper = &failingBlockMapper{}
			}
			events := newObjectRecorder(100)
			vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: fake.NewClientset(objs...), RootDir: t.TempDir(), Mounter: mounter,
				BlockMapper: mapper, EventRecorder: events}, drv)
			defer stop()
			pod := tt.pod(drv.DriverName(), host)
			if !tt.teardown {
				for _, f := range tt.faults {
					drv.Inject(f)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			vm.AddPod(pod)
			if tt.teardown {
				if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
					t.Fatal(err)
				}
				for _, f := range tt.faults {
					drv.Inject(f)
				}
				vm.DeletePod(pod)
			}
			if got, want := nextEvent(t, events), expand(tt.want); got != want {
				t.Errorf("event\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// podWith is a pod ns/p with vols, whatever the driver and host.
func podWith(vols ...csitest.PodVolume) func(string, string) *v1.Pod {
	return func(string, string) *v1.Pod { return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: vols}) }
}

// TestResolutionEventsOnce: a pod volume's resolution event is recorded
// once per cause: not again when the pod resolves again with the same
// error (every pod update, every claim change), again when the cause
// changes or the pod comes back after it was forgotten; errors the
// kubelet records no event for (no kubelet words, or not a plugin's
// refusal) give none.
func TestResolutionEventsOnce(t *testing.T) {
	tbl := resolve.NewTable(nil, clock.RealClock{})
	refused := func(text string) error {
		return fmt.Errorf("pod ns/p volume \"hp\": %w", marked{volume.Causef("%s", text), planner.ErrUnknownSource})
	}
	const uid = types.UID("u1")
	steps := []struct {
		name   string
		errs   map[string]error
		forget bool
		want   []string
	}{
		{name: "first", errs: map[string]error{"hp": refused("a")}, want: []string{`MountVolume.SetUp failed for volume "hp" : a`}},
		{name: "same again", errs: map[string]error{"hp": refused("a")}},
		{name: "cause changed", errs: map[string]error{"hp": refused("b")}, want: []string{`MountVolume.SetUp failed for volume "hp" : b`}},
		{name: "no kubelet words", errs: map[string]error{"hp": refused("b"), "x": marked{errors.New("no plugin"), planner.ErrUnknownSource}}},
		{name: "not a refusal", errs: map[string]error{"hp": refused("b"), "c": volume.Causef("claim")}},
		{name: "resolved, then the same error", errs: map[string]error{}},
		{name: "back", errs: map[string]error{"hp": refused("b")}, want: []string{`MountVolume.SetUp failed for volume "hp" : b`}},
		{name: "forgotten, then back", forget: true, errs: map[string]error{"hp": refused("b")}, want: []string{`MountVolume.SetUp failed for volume "hp" : b`}},
	}
	for _, s := range steps {
		if s.forget {
			tbl.Forget(uid)
		}
		if got := tbl.ResolutionEvents(uid, s.errs); !slices.Equal(got, s.want) {
			t.Errorf("%s: events %q, want %q", s.name, got, s.want)
		}
	}
}
