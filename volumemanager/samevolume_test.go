package volumemanager

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// sameClaimPod is a pod with claim "data" in two volumes, a and b
// (kubernetes#122140), read-only as asked.
func sameClaimPod(roA, roB bool) *v1.Pod {
	return csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "a", Claim: "data", ReadOnly: roA},
		{Name: "b", Claim: "data", ReadOnly: roB},
	}})
}

// withoutVolume returns pod without its volume name and the mounts of it.
func withoutVolume(pod *v1.Pod, name string) *v1.Pod {
	out := pod.DeepCopy()
	out.Spec.Volumes = slices.DeleteFunc(out.Spec.Volumes, func(v v1.Volume) bool { return v.Name == name })
	for i := range out.Spec.Containers {
		c := &out.Spec.Containers[i]
		c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return m.Name == name })
	}
	return out
}

// TestSameClaimInTwoVolumes: a pod with one PVC in two volumes has it
// published once, in the PV's directory; its wait ends, and each name
// lists the mount, read-only as the name asks; the mount is writable when
// one name writes.
func TestSameClaimInTwoVolumes(t *testing.T) {
	tests := []struct {
		name          string
		roA, roB      bool
		wantPublishRO bool
	}{
		{name: "both writable"},
		{name: "both read-only", roA: true, roB: true, wantPublishRO: true},
		{name: "a read-only", roA: true},
		{name: "b read-only", roB: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			pvName := e.claim("data")
			pod := sameClaimPod(tt.roA, tt.roB)
			if err := e.mount(pod, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if got := e.drv.Calls("NodePublishVolume"); got != 1 {
				t.Errorf("NodePublishVolume calls = %d, want 1", got)
			}
			req := e.request("NodePublishVolume").(*csi.NodePublishVolumeRequest)
			if req.GetReadonly() != tt.wantPublishRO {
				t.Errorf("NodePublishVolume readonly = %v, want %v", req.GetReadonly(), tt.wantPublishRO)
			}
			path := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pvName, "mount")
			if req.GetTargetPath() != path {
				t.Errorf("target path = %s, want %s", req.GetTargetPath(), path)
			}
			name := podvol.CSIVolumeName(e.drv.DriverName(), "handle-data")
			want := []podvol.MountedVolume{
				{Name: name, SpecName: "a", DirName: pvName, Path: path, ReadOnly: tt.roA},
				{Name: name, SpecName: "b", DirName: pvName, Path: path, ReadOnly: tt.roB},
			}
			for _, list := range []struct {
				what string
				got  []podvol.MountedVolume
			}{
				{"GetMountedVolumesForPod", e.vm.GetMountedVolumesForPod(pod.UID)},
				{"GetPossiblyMountedVolumesForPod", e.vm.GetPossiblyMountedVolumesForPod(pod.UID)},
			} {
				if len(list.got) != len(want) {
					t.Fatalf("%s = %+v, want a and b", list.what, list.got)
				}
				for i, w := range want {
					g := list.got[i]
					if g.Name != w.Name || g.SpecName != w.SpecName || g.DirName != w.DirName || g.Path != w.Path || g.ReadOnly != w.ReadOnly {
						t.Errorf("%s[%d] = %+v, want %+v", list.what, i, g, w)
					}
				}
			}
			e.unmount(pod)
			if got := e.drv.Calls("NodeUnpublishVolume"); got != 1 {
				t.Errorf("NodeUnpublishVolume calls = %d, want 1", got)
			}
		})
	}
}

// TestSameClaimDropOneName: an update that drops one of the two names
// keeps the mount (no unpublish), listed under the other; dropping both
// unpublishes it.
func TestSameClaimDropOneName(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	pod := sameClaimPod(false, false)
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	onlyB := withoutVolume(pod, "a")
	if err := e.vm.UpdatePod(onlyB); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update taken in and planned", func() bool {
		got := e.vm.GetMountedVolumesForPod(pod.UID)
		return len(got) == 1 && got[0].SpecName == "b" && e.vm.idle()
	})
	if got := e.drv.Calls("NodeUnpublishVolume"); got != 0 {
		t.Fatalf("NodeUnpublishVolume calls = %d after one name went, want 0", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, onlyB); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 1 {
		t.Errorf("NodePublishVolume calls = %d, want 1", got)
	}

	none := withoutVolume(onlyB, "b")
	if err := e.vm.UpdatePod(none); err != nil {
		t.Fatal(err)
	}
	if err := e.vm.WaitForUnmount(ctx, none); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodeUnpublishVolume"); got != 1 {
		t.Errorf("NodeUnpublishVolume calls = %d after both names went, want 1", got)
	}
}

// TestSameClaimWaitCauses: the error of the one publish explains the wait
// of both names.
func TestSameClaimWaitCauses(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", Err: status.Error(codes.Internal, "no room")})
	pod := sameClaimPod(false, false)
	e.vm.AddPod(pod)
	eventually(t, "the publish error recorded", func() bool {
		err := e.vm.podErrors(pod.UID)["a"]
		return err != nil && strings.Contains(err.Error(), "no room")
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := e.vm.WaitForAttachAndMount(ctx, pod)
	var we *WaitError
	if !errors.As(err, &we) {
		t.Fatalf("wait error = %v, want a *WaitError", err)
	}
	if !slices.Equal(we.Volumes, []string{"a", "b"}) {
		t.Errorf("volumes waited for = %v, want [a b]", we.Volumes)
	}
	for _, name := range []string{"a", "b"} {
		if c := we.Causes[name]; c == nil || !strings.Contains(c.Error(), "no room") {
			t.Errorf("cause of %s = %v, want the publish error", name, c)
		}
	}
}

// TestSameClaimRestart: after a restart, the one mount is found on disk
// (once), and the pod added again gets both names back on it, with at most
// the one idempotent publish an Uncertain mount gets.
func TestSameClaimRestart(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-data"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	root := t.TempDir()
	pod := sameClaimPod(false, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	vm1, stop1 := startVM(t, client, root, drv)
	vm1.AddPod(pod)
	if err := vm1.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stop1()
	publishes := drv.Calls("NodePublishVolume")

	vm2, stop2 := startVM(t, client, root, drv)
	defer stop2()
	if got := vm2.GetPossiblyMountedVolumesForPod(pod.UID); len(got) != 1 || got[0].DirName != pv.Name {
		t.Fatalf("found on disk for the pod: %+v, want the one mount in %s", got, pv.Name)
	}
	vm2.AddPod(pod)
	vm2.MarkPodsSynced()
	if err := vm2.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm2)
	got := vm2.GetMountedVolumesForPod(pod.UID)
	if len(got) != 2 || got[0].SpecName != "a" || got[1].SpecName != "b" || got[0].Path != got[1].Path {
		t.Errorf("mounted after the restart: %+v, want a and b on one path", got)
	}
	if n := drv.Calls("NodePublishVolume") - publishes; n > 1 {
		t.Errorf("NodePublishVolume calls after the restart = %d, want at most 1", n)
	}
	if n := drv.Calls("NodeUnpublishVolume"); n != 0 {
		t.Errorf("NodeUnpublishVolume calls after the restart = %d, want 0", n)
	}
	vm2.DeletePod(pod)
	if err := vm2.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if n := drv.Calls("NodeUnpublishVolume"); n != 1 {
		t.Errorf("NodeUnpublishVolume calls = %d, want 1", n)
	}
}

// TestSameClaimSELinux: the names of one volume share its one mount, and
// so its SELinux context: that of every container that mounts either. One
// context for all of them mounts the volume with it; containers with
// different labels are an error for both names, not a mount with the
// label of one that the others cannot read.
func TestSameClaimSELinux(t *testing.T) {
	for _, tc := range []struct {
		name    string
		otherB  bool // a second container mounts only b, with label B
		wantErr string
	}{
		{name: "one label"},
		{name: "different labels", otherB: true, wantErr: "different SELinux labels: " + contextA + ", " + contextB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
			pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{
				Driver:      drv.DriverName(),
				Handle:      "handle-data",
				AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod},
			})
			client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{SELinuxMount: true}), pvc, pv)
			vm, stop := seLinuxVM(t, client, t.TempDir(), drv, true, nil)
			defer stop()
			pod := sameClaimPod(false, false)
			pod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelA}}
			if tc.otherB {
				pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "other",
					VolumeMounts:    []v1.VolumeMount{{Name: "b", MountPath: "/b"}},
					SecurityContext: &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: levelB}}})
			}
			vm.AddPod(pod)
			if tc.wantErr != "" {
				// Both names get the error (a PV not listed yet is
				// another error, for a while).
				eventually(t, "both names refused for their labels", func() bool {
					st, _ := vm.dsw.Pod(pod.UID)
					for _, name := range []string{"a", "b"} {
						if err := st.Errors[name]; err == nil || !strings.Contains(err.Error(), tc.wantErr) {
							return false
						}
					}
					return true
				})
				if n := drv.Calls("NodePublishVolume"); n != 0 {
					t.Errorf("NodePublishVolume calls = %d, want 0", n)
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
				t.Fatal(err)
			}
			want := [][]string{{`context="` + contextA + `"`}}
			if got := mountFlags(drv, "NodePublishVolume"); !reflect.DeepEqual(got, want) {
				t.Errorf("NodePublishVolume mount_flags = %q, want %q", got, want)
			}
		})
	}
}

// TestTwoPVsOneVolume: two PVs name one volume (the same driver and
// handle, as upstream's "should mount multiple PV pointing to the same
// storage on the same node" makes them), each a pod's: the volume is
// staged once and published into each pod's directory named after that
// pod's own PV, and each pod's unpublish is of its own directory, the
// second pod's first, so that the volume is unstaged only once neither is
// published (a driver that checks the volume's lifecycle refuses an
// unstage while a publish is left).
func TestTwoPVsOneVolume(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv1 := e.claim("one")
	pvc2, pv2 := csitest.BoundClaim("ns", "two", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-one"})
	e.create(pvc2, pv2)
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "one"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "two"}}})
	for _, p := range []*v1.Pod{p1, p2} {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	path := func(p *v1.Pod, pv string) string {
		return filepath.Join(e.root, "pods", string(p.UID), "volumes", "kubernetes.io~csi", pv, "mount")
	}
	targets := func(method string) []string {
		var out []string
		for _, r := range e.drv.Requests() {
			switch req := r.Req.(type) {
			case *csi.NodePublishVolumeRequest:
				if r.Method == method {
					out = append(out, req.GetTargetPath())
				}
			case *csi.NodeUnpublishVolumeRequest:
				if r.Method == method {
					out = append(out, req.GetTargetPath())
				}
			}
		}
		return out
	}
	if got, want := targets("NodePublishVolume"), []string{path(p1, pv1), path(p2, pv2.Name)}; !slices.Equal(got, want) {
		t.Fatalf("NodePublishVolume target paths %q, want %q", got, want)
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 1 {
		t.Errorf("NodeStageVolume calls = %d, want 1", n)
	}
	if got := e.vm.GetMountedVolumesForPod(p2.UID); len(got) != 1 || got[0].DirName != pv2.Name || got[0].Path != path(p2, pv2.Name) {
		t.Errorf("GetMountedVolumesForPod(p2) = %+v, want its own PV's directory %s", got, path(p2, pv2.Name))
	}
	e.unmount(p2)
	if got, want := targets("NodeUnpublishVolume"), []string{path(p2, pv2.Name)}; !slices.Equal(got, want) {
		t.Fatalf("NodeUnpublishVolume target paths %q after p2 went, want %q", got, want)
	}
	e.unmount(p1)
	if got, want := targets("NodeUnpublishVolume"), []string{path(p2, pv2.Name), path(p1, pv1)}; !slices.Equal(got, want) {
		t.Errorf("NodeUnpublishVolume target paths %q, want %q", got, want)
	}
	eventually(t, "the unstage", func() bool { return e.drv.Calls("NodeUnstageVolume") == 1 })
}

// TestTwoPVsOneVolumeRestart: after a restart, each pod's mount of one
// volume under two PVs is found in its own PV's directory, and a pod no
// longer wanted is unpublished there, before the unstage.
func TestTwoPVsOneVolumeRestart(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc1, pv1 := csitest.BoundClaim("ns", "one", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-one"})
	pvc2, pv2 := csitest.BoundClaim("ns", "two", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-one"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc1, pv1, pvc2, pv2)
	root := t.TempDir()
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "one"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "two"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	vm1, stop1 := startVM(t, client, root, drv)
	for _, p := range []*v1.Pod{p1, p2} {
		vm1.AddPod(p)
		if err := vm1.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	stop1()

	vm2, stop2 := startVM(t, client, root, drv)
	defer stop2()
	for p, pv := range map[*v1.Pod]string{p1: pv1.Name, p2: pv2.Name} {
		if got := vm2.GetPossiblyMountedVolumesForPod(p.UID); len(got) != 1 || got[0].DirName != pv {
			t.Fatalf("found on disk for pod %s: %+v, want its mount in %s", p.Name, got, pv)
		}
	}
	vm2.AddPod(p1)
	vm2.MarkPodsSynced()
	waitIdle(t, vm2)
	var unpublished []string
	for _, r := range drv.Requests() {
		if req, ok := r.Req.(*csi.NodeUnpublishVolumeRequest); ok {
			unpublished = append(unpublished, req.GetTargetPath())
		}
	}
	want := filepath.Join(root, "pods", string(p2.UID), "volumes", "kubernetes.io~csi", pv2.Name, "mount")
	if !slices.Equal(unpublished, []string{want}) {
		t.Errorf("NodeUnpublishVolume target paths %q, want p2's own %q", unpublished, want)
	}
	if n := drv.Calls("NodeUnstageVolume"); n != 0 {
		t.Errorf("NodeUnstageVolume calls = %d while p1 has the volume, want 0", n)
	}
}
