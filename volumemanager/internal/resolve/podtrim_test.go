package resolve

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/volume"
)

// trimPod is the pod the loop resolves for pod.
// keptOf is Keep with the default plugins.
func keptOf(pod *v1.Pod) *KeptPod {
	return Keep(pod, testPlugins)
}

func trimPod(pod *v1.Pod) *v1.Pod { return keptOf(pod).Pod() }

// busyPod is a pod as the API server gives it: most of its bytes are of no
// interest to nodevol.
func busyPod() *v1.Pod {
	p := csitest.Pod("ns", "web", csitest.PodSpec{FSGroup: ptr.To[int64](2000), ServiceAccount: "sa", Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "claim-data"},
		{Name: "raw", Claim: "claim-raw", ReadOnly: true, Block: true},
		{Name: "inline", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "inline.csi.example.com", VolumeAttributes: map[string]string{"size": "1Gi"}}}},
		{Name: "scratch", Source: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To("fast"),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		}}}}},
	}})
	p.Labels = map[string]string{"app": "web"}
	p.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"a":"b"}`}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-1", UID: "rs-uid"}}
	p.Spec.SecurityContext.SupplementalGroups = []int64{5, 6}
	p.Spec.SecurityContext.FSGroupChangePolicy = ptr.To(v1.FSGroupChangeOnRootMismatch)
	p.Spec.SecurityContext.SELinuxOptions = &v1.SELinuxOptions{Level: "s0:c1,c2"}
	p.Spec.SecurityContext.SELinuxChangePolicy = ptr.To(v1.SELinuxChangePolicyMountOption)
	p.Spec.SecurityContext.RunAsUser = ptr.To(int64(1000))
	p.Spec.Volumes = append(p.Spec.Volumes,
		v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
		v1.Volume{Name: "unused", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim-unused"}}},
		v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1", FSType: "ext4"}}},
	)
	c := &p.Spec.Containers[0]
	c.Image = "registry.example.com/web:1.2.3"
	c.Command = []string{"/bin/web", "--port=8080"}
	c.Env = []v1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}}
	c.Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
	c.VolumeMounts = append(c.VolumeMounts,
		v1.VolumeMount{Name: "config", MountPath: "/etc/web"},
		v1.VolumeMount{Name: "ebs", MountPath: "/ebs", SubPath: "x", ReadOnly: true})
	c.SecurityContext = &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c3,c4"}, Privileged: ptr.To(false)}
	p.Spec.InitContainers = []v1.Container{
		{Name: "init-data", Image: "busybox", VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/d"}}},
		{Name: "init-config", Image: "busybox", VolumeMounts: []v1.VolumeMount{{Name: "config", MountPath: "/c"}}},
	}
	p.Spec.EphemeralContainers = []v1.EphemeralContainer{
		{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug", Image: "busybox",
			VolumeMounts:    []v1.VolumeMount{{Name: "scratch", MountPath: "/s"}},
			SecurityContext: &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c5,c6"}}}},
		{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug-config", Image: "busybox",
			VolumeMounts: []v1.VolumeMount{{Name: "config", MountPath: "/c"}}}},
	}
	p.Spec.NodeName = "node-1"
	p.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.1", Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}}
	return p
}

// TestTrimPod checks that every function reading a pod in this package
// gives the same answer for trimPod's copy as for the pod, and that the
// copy shares no memory with the pod.
func TestTrimPod(t *testing.T) {
	tests := []struct {
		name string
		pod  *v1.Pod
	}{
		{"busy pod: PVC, block PVC, inline CSI, generic ephemeral, migrated in-tree, configMap, unmounted claim", busyPod()},
		{"no volumes", csitest.Pod("ns", "empty", csitest.PodSpec{})},
		{"only a configMap", func() *v1.Pod {
			p := csitest.Pod("ns", "cm", csitest.PodSpec{})
			p.Spec.Volumes = []v1.Volume{{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "config", MountPath: "/c"}}
			return p
		}()},
		{"no security context", csitest.Pod("ns", "plain", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "claim", ReadOnly: true},
		}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := tt.pod.DeepCopy()
			got := trimPod(tt.pod)
			if diff := cmp.Diff(orig, tt.pod); diff != "" {
				t.Fatalf("trimPod changed its argument (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(PodRef(orig), PodRef(got)); diff != "" {
				t.Errorf("podRef (-pod +trimmed):\n%s", diff)
			}
			wantVols, wantBlock := selected(orig)
			gotVols, gotBlock := selected(got)
			if diff := cmp.Diff(wantVols, gotVols); diff != "" {
				t.Errorf("podVolumes volumes (-pod +trimmed):\n%s", diff)
			}
			if diff := cmp.Diff(wantBlock, gotBlock); diff != "" {
				t.Errorf("podVolumes block (-pod +trimmed):\n%s", diff)
			}
			// Both are called for nodevol's volumes only: resolvePod's errs
			// and seLinuxLabel's volumes are PodVolumes'.
			errs := map[string]error{}
			for _, v := range wantVols {
				if diff := cmp.Diff(containerSELinuxOptions(orig, v.Name), containerSELinuxOptions(got, v.Name)); diff != "" {
					t.Errorf("containerSELinuxOptions(%s) (-pod +trimmed):\n%s", v.Name, diff)
				}
				errs[v.Name] = errors.New("not resolved")
			}
			if diff := cmp.Diff(waitingClaims(orig, errs), waitingClaims(got, errs)); diff != "" {
				t.Errorf("waitingClaims (-pod +trimmed):\n%s", diff)
			}
			// resolveVolume, seLinuxLabel: the pod security context's fields.
			if sc := orig.Spec.SecurityContext; sc != nil {
				g := got.Spec.SecurityContext
				if g == nil || !cmp.Equal(sc.FSGroup, g.FSGroup) || !cmp.Equal(sc.FSGroupChangePolicy, g.FSGroupChangePolicy) ||
					!cmp.Equal(sc.SELinuxOptions, g.SELinuxOptions) || !cmp.Equal(sc.SELinuxChangePolicy, g.SELinuxChangePolicy) {
					t.Errorf("pod security context = %+v, want the fsGroup, SELinux and change policies of %+v", g, sc)
				}
			} else if got.Spec.SecurityContext != nil {
				t.Errorf("pod security context = %+v, want none", got.Spec.SecurityContext)
			}
			kept := keptOf(tt.pod)
			// No pointer into the caller's pod: changing it changes no copy.
			before := got.DeepCopy()
			scribble(tt.pod)
			if diff := cmp.Diff(before, got); diff != "" {
				t.Errorf("the copy shares memory with the pod (-before +after changing the pod):\n%s", diff)
			}
			if diff := cmp.Diff(before, kept.Pod()); diff != "" {
				t.Errorf("the kept pod shares memory with the pod (-before +after changing the pod):\n%s", diff)
			}
		})
	}
}

// scribble changes every pointer field trimPod could have copied.
func scribble(p *v1.Pod) {
	if sc := p.Spec.SecurityContext; sc != nil {
		for _, f := range []*int64{sc.FSGroup} {
			if f != nil {
				*f++
			}
		}
		if sc.SELinuxOptions != nil {
			sc.SELinuxOptions.Level = "changed"
		}
		if sc.FSGroupChangePolicy != nil {
			*sc.FSGroupChangePolicy = "changed"
		}
		if sc.SELinuxChangePolicy != nil {
			*sc.SELinuxChangePolicy = "changed"
		}
	}
	for i := range p.Spec.Volumes {
		v := &p.Spec.Volumes[i]
		if v.PersistentVolumeClaim != nil {
			v.PersistentVolumeClaim.ClaimName = "changed"
		}
		if v.CSI != nil {
			v.CSI.VolumeAttributes["size"] = "changed"
		}
		if v.Ephemeral != nil && v.Ephemeral.VolumeClaimTemplate != nil {
			v.Ephemeral.VolumeClaimTemplate.Spec.AccessModes[0] = "changed"
		}
	}
	for _, cs := range [][]v1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			if sc := cs[i].SecurityContext; sc != nil && sc.SELinuxOptions != nil {
				sc.SELinuxOptions.Level = "changed"
			}
		}
	}
	for i := range p.Spec.EphemeralContainers {
		if sc := p.Spec.EphemeralContainers[i].SecurityContext; sc != nil && sc.SELinuxOptions != nil {
			sc.SELinuxOptions.Level = "changed"
		}
	}
}

// TestTrimPodKeeps is the copy of busyPod, exactly: what is not here is not
// kept per pod.
func TestTrimPodKeeps(t *testing.T) {
	p := busyPod()
	vols, _ := selected(p)
	want := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: p.UID},
		Spec: v1.PodSpec{
			ServiceAccountName: "sa",
			SecurityContext: &v1.PodSecurityContext{
				FSGroup:             ptr.To(int64(2000)),
				FSGroupChangePolicy: ptr.To(v1.FSGroupChangeOnRootMismatch),
				SELinuxOptions:      &v1.SELinuxOptions{Level: "s0:c1,c2"},
				SELinuxChangePolicy: ptr.To(v1.SELinuxChangePolicyMountOption),
			},
			Volumes: vols,
			InitContainers: []v1.Container{
				{Name: "init-data", VolumeMounts: []v1.VolumeMount{{Name: "data"}}},
				{Name: "init-config", VolumeMounts: []v1.VolumeMount{{Name: "config"}}},
			},
			Containers: []v1.Container{{
				Name:            p.Spec.Containers[0].Name,
				VolumeMounts:    []v1.VolumeMount{{Name: "data"}, {Name: "inline"}, {Name: "scratch"}, {Name: "config"}, {Name: "ebs"}},
				VolumeDevices:   []v1.VolumeDevice{{Name: "raw"}},
				SecurityContext: &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c3,c4"}},
			}},
			EphemeralContainers: []v1.EphemeralContainer{
				{EphemeralContainerCommon: v1.EphemeralContainerCommon{
					Name: "debug", VolumeMounts: []v1.VolumeMount{{Name: "scratch"}},
					SecurityContext: &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c5,c6"}},
				}},
				{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug-config", VolumeMounts: []v1.VolumeMount{{Name: "config"}}}},
			},
		},
	}
	if names := []string{"data", "raw", "inline", "scratch", "config", "ebs"}; len(vols) != len(names) {
		t.Fatalf("busyPod has %d nodevol volumes, want %v", len(vols), names)
	}
	if diff := cmp.Diff(want, trimPod(p)); diff != "" {
		t.Errorf("trimPod (-want +got):\n%s", diff)
	}
}

// TestKeptPodDeleted: a pod the inbox no longer has is nil to the loop
// (deleted).
func TestKeptPodDeleted(t *testing.T) {
	var k *KeptPod
	if p := k.Pod(); p != nil {
		t.Errorf("nil KeptPod gives %v, want nil", p)
	}
}

// TestKeptPodBytes holds what the inbox keeps of a pod with one claim
// under a bound: the deep copy it kept before was 2.1 KiB for a small pod
// with one claim (now about 0.5 KiB), 10.4 KiB for busyPod (now 4.9 KiB:
// its six volumes, 256 bytes each, and the claim template).
//
// It measures in a process of its own, the test binary run again for this
// test alone: in the package's process, goroutines that earlier tests left
// winding down free memory while it measures, and the live heap it reads
// can go down as it keeps pods.
func TestKeptPodBytes(t *testing.T) {
	if !measuringProcess(t) {
		return
	}
	const n = 2000
	for _, tt := range []struct {
		name  string
		pod   *v1.Pod
		limit float64
	}{
		{"one claim", csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "claim"}}}), 800},
		{"busy pod", busyPod(), 5500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kept := make([]*KeptPod, n)
			before := liveBytes()
			for i := range kept {
				kept[i] = keptOf(tt.pod)
			}
			after := liveBytes()
			runtime.KeepAlive(kept)
			per := (float64(after) - float64(before)) / n
			t.Logf("%s: %.0f bytes kept per pod (a deep copy: %d)", tt.name, per, deepCopyBytes(tt.pod))
			if per > tt.limit {
				t.Errorf("%s: %.0f bytes kept per pod, want at most %.0f", tt.name, per, tt.limit)
			}
		})
	}
}

func deepCopyBytes(p *v1.Pod) uint64 {
	const n = 200
	copies := make([]*v1.Pod, n)
	before := liveBytes()
	for i := range copies {
		copies[i] = p.DeepCopy()
	}
	after := liveBytes()
	runtime.KeepAlive(copies)
	return (after - before) / n
}

// liveBytes returns the bytes of live heap objects after a collection.
// measuringProcess runs the calling test again alone, in a process of
// its own (the test binary, with an environment variable that tells it),
// and reports whether this is that process: a test that measures the live
// heap measures there, where no goroutine left by an earlier test is
// allocating or freeing meanwhile.
func measuringProcess(t *testing.T) bool {
	t.Helper()
	const childEnv = "NODEVOL_MEASURING_PROCESS"
	if os.Getenv(childEnv) != "" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("the measuring process:\n%s", out)
	if err != nil {
		t.Fatalf("the measuring process failed: %v", err)
	}
	return false
}

func liveBytes() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestTrimPodKeepsWhatVolumesShow: a pod keeps its labels and annotations
// when a downward API file shows them, every container's limits and
// requests when one shows a container's resources, and the cpu, memory
// and hugepage limits and requests (the containers', the pod-level ones
// and the overhead) that size a secret's or projected volume's tmpfs; a
// pod with none of these keeps none of it.
func TestTrimPodKeepsWhatVolumesShow(t *testing.T) {
	res := v1.ResourceRequirements{
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi"), v1.ResourceCPU: resource.MustParse("2"), v1.ResourceEphemeralStorage: resource.MustParse("1Gi")},
		Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("512Mi"), v1.ResourceCPU: resource.MustParse("1"), v1.ResourceEphemeralStorage: resource.MustParse("1Gi")},
	}
	podRes := &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("2Gi")}}
	pod := func(src v1.VolumeSource) *v1.Pod {
		p := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "v", Source: src}}})
		p.Labels, p.Annotations = map[string]string{"app": "web"}, map[string]string{"a": "b"}
		p.Spec.Containers[0].Resources = res
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "sidecar", Resources: res})
		p.Spec.Resources, p.Spec.Overhead = podRes.DeepCopy(), v1.ResourceList{v1.ResourceMemory: resource.MustParse("10Mi")}
		return p
	}
	labels := []v1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}
	cpu := []v1.DownwardAPIVolumeFile{{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "sidecar", Resource: "limits.cpu"}}}
	tests := []struct {
		name               string
		src                v1.VolumeSource
		meta, all, memOnly bool
	}{
		{name: "emptyDir on disk", src: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{name: "downward labels", src: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: labels}}, meta: true},
		{name: "downward resources", src: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: cpu}}, all: true},
		{name: "secret", src: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}, memOnly: true},
		{name: "projected with labels", src: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{DownwardAPI: &v1.DownwardAPIProjection{Items: labels}}}}}, meta: true, memOnly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := trimPod(pod(tt.src))
			if (got.Labels != nil) != tt.meta || (got.Annotations != nil) != tt.meta {
				t.Errorf("labels %v, annotations %v; want them kept: %v", got.Labels, got.Annotations, tt.meta)
			}
			var want []v1.ResourceRequirements
			switch {
			case tt.all:
				want = []v1.ResourceRequirements{res, res}
			case tt.memOnly:
				sized := v1.ResourceRequirements{
					Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi"), v1.ResourceCPU: resource.MustParse("2")},
					Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("512Mi"), v1.ResourceCPU: resource.MustParse("1")},
				}
				want = []v1.ResourceRequirements{sized, sized}
			}
			var have []v1.ResourceRequirements
			for _, c := range got.Spec.Containers {
				if c.Resources.Limits != nil || c.Resources.Requests != nil {
					have = append(have, c.Resources)
				}
			}
			if !equality.Semantic.DeepEqual(have, want) {
				t.Errorf("containers' resources kept %v, want %v", have, want)
			}
			// The pod-level limits and the overhead size a tmpfs; they
			// go with the containers' limits.
			Keep := tt.all || tt.memOnly
			if (got.Spec.Resources != nil) != Keep || (got.Spec.Overhead != nil) != Keep {
				t.Errorf("pod-level resources %v, overhead %v; want them kept: %v", got.Spec.Resources, got.Spec.Overhead, Keep)
			} else if Keep && !equality.Semantic.DeepEqual(got.Spec.Resources, podRes) {
				t.Errorf("pod-level resources %v, want %v", got.Spec.Resources, podRes)
			}
		})
	}
}

// TestTrimPodResolvesAlike: every volume of a pod resolves to the same
// spec from what the inbox keeps of it as from the pod itself, with the
// plugins' own ResolveSpec reading it (an emptyDir's tmpfs size from
// memory limits, a hugepages emptyDir's page size from hugepage
// requests, which the API server defaults from limits). Node e2e's
// HugePages specs found the kept pod had lost the requests: its
// hugepages volume failed with "there is no resource request for huge
// pages" on the fork and mounted on the stock kubelet.
func TestTrimPodResolvesAlike(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi")}}}
	defaults, err := defaultPlugins(pluginsConfig{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)}, func() (*v1.Node, error) { return node, nil },
		objectcache.New(objectcache.Config{Client: fake.NewClientset()}), tokens.New(fake.NewClientset(), nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := volume.NewRegistry(append([]volume.Plugin{newCSIPlugin(t.TempDir())}, defaults...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := testResolver(t)
	r.Plugins = plugins
	hp2Mi, hp1Gi := v1.ResourceName(v1.ResourceHugePagesPrefix+"2Mi"), v1.ResourceName(v1.ResourceHugePagesPrefix+"1Gi")
	// res is a container's resources as the API server gives them back:
	// requests defaulted from limits.
	res := func(l v1.ResourceList) v1.ResourceRequirements {
		return v1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
	}
	emptyDir := func(name string, m v1.StorageMedium) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: m}}}
	}
	pod := func(vols []v1.Volume, containers ...v1.ResourceRequirements) *v1.Pod {
		p := csitest.Pod("ns", "p", csitest.PodSpec{})
		p.Spec.Volumes = vols
		c := p.Spec.Containers[0]
		p.Spec.Containers = nil
		for i, r := range containers {
			c := *c.DeepCopy()
			c.Name, c.Resources = fmt.Sprintf("c%d", i), r
			for _, v := range vols {
				c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
			}
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
		return p
	}
	mem := v1.ResourceList{v1.ResourceMemory: resource.MustParse("100Mi"), v1.ResourceCPU: resource.MustParse("10m")}
	tests := []struct {
		name string
		pod  *v1.Pod
	}{
		{"hugepages-2Mi medium, container limits (node e2e HugePages, new API)",
			pod([]v1.Volume{emptyDir("hp", "HugePages-2Mi")}, res(v1.ResourceList{v1.ResourceMemory: resource.MustParse("100Mi"), hp2Mi: resource.MustParse("6Mi")}))},
		{"HugePages medium, one size", pod([]v1.Volume{emptyDir("hp", v1.StorageMediumHugePages)}, res(v1.ResourceList{hp2Mi: resource.MustParse("4Mi")}))},
		{"HugePages medium, two sizes", pod([]v1.Volume{emptyDir("hp", v1.StorageMediumHugePages)},
			res(v1.ResourceList{hp2Mi: resource.MustParse("4Mi")}), res(v1.ResourceList{hp1Gi: resource.MustParse("1Gi")}))},
		{"hugepages in an init container", func() *v1.Pod {
			p := pod([]v1.Volume{emptyDir("hp1g", "HugePages-1Gi")}, res(mem))
			p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: res(v1.ResourceList{hp1Gi: resource.MustParse("1Gi")})}}
			return p
		}()},
		{"hugepages at pod level", func() *v1.Pod {
			p := pod([]v1.Volume{emptyDir("hp", "HugePages-2Mi")}, v1.ResourceRequirements{})
			r := res(v1.ResourceList{hp2Mi: resource.MustParse("2Mi")})
			p.Spec.Resources = &r
			return p
		}()},
		{"no hugepage request", pod([]v1.Volume{emptyDir("hp", "HugePages-2Mi")}, res(mem))},
		{"memory medium", pod([]v1.Volume{emptyDir("m", v1.StorageMediumMemory)}, res(mem), res(mem))},
		{"busy pod", busyPod()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, want, wantErrs := r.ResolvePod(tt.pod)
			_, _, got, gotErrs := r.ResolvePod(trimPod(tt.pod))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("resolved volumes (-pod +kept):\n%s", diff)
			}
			errText := func(errs map[string]error) map[string]string {
				out := map[string]string{}
				for k, err := range errs {
					out[k] = err.Error()
				}
				return out
			}
			if diff := cmp.Diff(errText(wantErrs), errText(gotErrs)); diff != "" {
				t.Errorf("errors (-pod +kept):\n%s", diff)
			}
		})
	}
}

// BenchmarkKeepPod is what AddPod copies of a usual pod: one claim, the
// kube-api-access projected volume every pod has (which keeps the sizing
// resources) and a container with cpu and memory requests and limits.
func BenchmarkKeepPod(b *testing.B) {
	p := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "claim"}}})
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
		Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3607))}}}}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "kube-api-access", MountPath: "/var/run/secrets"})
	l := v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")}
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
	p.Status.QOSClass = v1.PodQOSGuaranteed
	b.ReportAllocs()
	for b.Loop() {
		keptOf(p)
	}
}
