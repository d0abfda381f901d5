package emptydir

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func TestResolveMemorySize(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	sidecar := func(c v1.Container) v1.Container { c.RestartPolicy = &always; return c }
	gi := int64(1 << 30)
	tests := []struct {
		name      string
		pod       *v1.Pod
		sizeLimit *resource.Quantity
		alloc     func() (int64, error)
		want      string // sizeBytes, "" for none
	}{
		{name: "sizeLimit below the pod's limit", pod: testPod(ctr(mem("2Gi"), mem("2Gi"))), sizeLimit: quantity("64Mi"), want: "67108864"},
		{name: "the pod's limit below sizeLimit", pod: testPod(ctr(mem("32Mi"), mem("32Mi"))), sizeLimit: quantity("64Mi"), want: "33554432"},
		{name: "sizeLimit 0 is no limit", pod: testPod(ctr(mem("32Mi"), mem("32Mi"))), sizeLimit: quantity("0"), want: "33554432"},
		{name: "sizeLimit above allocatable", pod: testPod(ctr(nil, nil)), sizeLimit: quantity("4Gi"),
			alloc: func() (int64, error) { return gi, nil }, want: "1073741824"},
		{name: "allocatable only", pod: testPod(ctr(nil, nil)), alloc: func() (int64, error) { return gi, nil }, want: "1073741824"},
		{name: "nothing bounds it", pod: testPod(ctr(nil, nil))},
		{name: "containers' limits summed", pod: testPod(ctr(mem("100Mi"), mem("100Mi")), ctr(mem("28Mi"), mem("28Mi"))), want: "134217728"},
		{name: "burstable with a container without a memory limit: no pod limit",
			pod: testPod(ctr(mem("100Mi"), mem("50Mi")), ctr(nil, mem("10Mi"))), alloc: func() (int64, error) { return gi, nil }, want: "1073741824"},
		{name: "burstable with every limit declared", pod: testPod(ctr(mem("100Mi"), mem("50Mi"))), want: "104857600"},
		{name: "an init container larger than the containers", pod: func() *v1.Pod {
			p := testPod(ctr(mem("100Mi"), mem("100Mi")))
			p.Spec.InitContainers = []v1.Container{ctr(mem("300Mi"), mem("300Mi"))}
			return p
		}(), want: "314572800"},
		{name: "sidecars add up and add to later init containers", pod: func() *v1.Pod {
			p := testPod(ctr(mem("100Mi"), mem("100Mi")))
			p.Spec.InitContainers = []v1.Container{sidecar(ctr(mem("50Mi"), mem("50Mi"))), ctr(mem("120Mi"), mem("120Mi"))}
			return p // max(100+50, 50+120) = 170Mi
		}(), want: "178257920"},
		{name: "an init container without a limit: none", pod: func() *v1.Pod {
			p := testPod(ctr(mem("100Mi"), mem("100Mi")))
			p.Spec.InitContainers = []v1.Container{ctr(nil, nil)}
			return p
		}()},
		{name: "pod-level limit", pod: func() *v1.Pod {
			p := testPod(ctr(nil, nil))
			p.Spec.Resources = &v1.ResourceRequirements{Limits: mem("200Mi"), Requests: mem("100Mi")}
			return p
		}(), want: "209715200"},
		{name: "pod-level limit replaces the containers'", pod: func() *v1.Pod {
			p := testPod(ctr(mem("500Mi"), mem("500Mi")))
			p.Spec.Resources = &v1.ResourceRequirements{Limits: mem("200Mi"), Requests: mem("200Mi")}
			return p
		}(), want: "209715200"},
		{name: "overhead added to a limit", pod: func() *v1.Pod {
			p := testPod(ctr(mem("100Mi"), mem("100Mi")))
			p.Spec.Overhead = mem("10Mi")
			return p
		}(), want: "115343360"},
		{name: "status QoS BestEffort: no pod limit", pod: func() *v1.Pod {
			p := testPod(ctr(mem("100Mi"), mem("100Mi")))
			p.Status.QOSClass = v1.PodQOSBestEffort
			return p
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, tt.alloc)
			spec := tp.spec(t, tt.pod, "mem", v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: tt.sizeLimit})
			want := map[string]string{attrMedium: "Memory"}
			if tt.want != "" {
				want[attrSize] = tt.want
			}
			if diff := cmp.Diff(want, spec.Attributes); diff != "" {
				t.Errorf("attributes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResolveMemoryNodeNotRead: a memory volume waits (ErrNotReady) while
// the node's allocatable memory cannot be read, even with a sizeLimit, as
// the kubelet fails the mount then: no tmpfs is mounted with another bound
// than the kubelet's.
func TestResolveMemoryNodeNotRead(t *testing.T) {
	tp := newTestPlugin(t, func() (int64, error) { return 0, errors.New("no figure") })
	spec := &podvol.VolumeSpec{Name: volumeName(testUID, "mem"), Plugin: PluginName,
		Source: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: quantity("8Gi")}}}
	err := tp.ResolveSpec(testPod(ctr(nil, nil)), spec)
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "error retrieving node: no figure") {
		t.Errorf("ResolveSpec = %v, want ErrNotReady naming the node", err)
	}
	disk := &podvol.VolumeSpec{Name: volumeName(testUID, "disk"), Plugin: PluginName, Source: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}
	if err := tp.ResolveSpec(testPod(ctr(nil, nil)), disk); err != nil {
		t.Errorf("a disk volume does not read the node: %v", err)
	}
}

func TestResolveHugePages(t *testing.T) {
	hp := func(sizes ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for _, s := range sizes {
			l[v1.ResourceName(v1.ResourceHugePagesPrefix+s)] = resource.MustParse("4Mi")
		}
		return l
	}
	tests := []struct {
		name    string
		medium  v1.StorageMedium
		pod     *v1.Pod
		want    string
		wantErr string
	}{
		{name: "HugePages, one size", medium: "HugePages", pod: testPod(ctr(hp("2Mi"), hp("2Mi"))), want: "2Mi"},
		{name: "HugePages, same size in two containers", medium: "HugePages", pod: testPod(ctr(hp("2Mi"), hp("2Mi")), ctr(hp("2Mi"), hp("2Mi"))), want: "2Mi"},
		{name: "HugePages, two sizes", medium: "HugePages", pod: testPod(ctr(hp("2Mi", "1Gi"), hp("2Mi", "1Gi"))),
			wantErr: "medium: HugePages can't be used if container requests multiple huge page sizes"},
		{name: "HugePages, none requested", medium: "HugePages", pod: testPod(ctr(mem("1Gi"), mem("1Gi"))),
			wantErr: "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"},
		{name: "HugePages-1Gi among two sizes", medium: "HugePages-1Gi", pod: testPod(ctr(hp("2Mi", "1Gi"), hp("2Mi", "1Gi"))), want: "1Gi"},
		{name: "HugePages-2Mi in an init container", medium: "HugePages-2Mi", pod: func() *v1.Pod {
			p := testPod(ctr(nil, nil))
			p.Spec.InitContainers = []v1.Container{ctr(hp("2Mi"), hp("2Mi"))}
			return p
		}(), want: "2Mi"},
		{name: "HugePages-2Mi at pod level", medium: "HugePages-2Mi", pod: func() *v1.Pod {
			p := testPod(ctr(nil, nil))
			p.Spec.Resources = &v1.ResourceRequirements{Limits: hp("2Mi"), Requests: hp("2Mi")}
			return p
		}(), want: "2Mi"},
		{name: "HugePages-2048Ki is 2Mi", medium: "HugePages-2048Ki", pod: testPod(ctr(hp("2Mi"), hp("2Mi"))), want: "2Mi"},
		{name: "HugePages-1Gi not requested", medium: "HugePages-1Gi", pod: testPod(ctr(hp("2Mi"), hp("2Mi"))),
			wantErr: "medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"},
		{name: "HugePages-x", medium: "HugePages-x", pod: testPod(ctr(hp("2Mi"), hp("2Mi"))), wantErr: "medium HugePages-x: invalid page size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			spec := tp.spec(t, nil, "hp", v1.EmptyDirVolumeSource{Medium: tt.medium})
			err := tp.ResolveSpec(tt.pod, spec)
			if tt.wantErr != "" {
				checkResolveErr(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{attrMedium: string(tt.medium), attrPageSize: tt.want}
			if diff := cmp.Diff(want, spec.Attributes); diff != "" {
				t.Errorf("attributes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveBadInput(t *testing.T) {
	tests := []struct {
		name    string
		src     *v1.VolumeSource
		wantErr string
	}{
		{name: "negative sizeLimit", src: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{SizeLimit: quantity("-1Mi")}}, wantErr: "sizeLimit -1Mi is negative"},
		{name: "negative sizeLimit, memory", src: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: "Memory", SizeLimit: quantity("-1")}}, wantErr: "sizeLimit -1 is negative"},
		{name: "unknown medium", src: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: "Disk"}}, wantErr: `unknown storage medium "Disk"`},
		{name: "no emptyDir source", src: &v1.VolumeSource{}, wantErr: "the spec has no emptyDir source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			spec := &podvol.VolumeSpec{Name: volumeName(testUID, "v"), Plugin: PluginName, Source: tt.src}
			checkResolveErr(t, tp.ResolveSpec(testPod(ctr(nil, nil)), spec), tt.wantErr)
			if spec.Attributes != nil {
				t.Errorf("attributes set on an error: %v", spec.Attributes)
			}
		})
	}
}

// checkResolveErr checks that err names the pod, the volume and the cause.
func checkResolveErr(t *testing.T, err error, cause string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", cause)
	}
	for _, s := range []string{"ns/pod", string(testUID), cause} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

func TestResolveDisk(t *testing.T) {
	tp := newTestPlugin(t, nil)
	spec := tp.spec(t, testPod(ctr(nil, nil)), "d", v1.EmptyDirVolumeSource{SizeLimit: quantity("1Gi")})
	if diff := cmp.Diff(map[string]string{attrMedium: ""}, spec.Attributes); diff != "" {
		t.Errorf("attributes (-want +got):\n%s", diff)
	}
}

func TestKernelAtLeast(t *testing.T) {
	for rel, want := range map[string]bool{
		"6.4.0": true, "6.18.44-fc": true, "7.0": true, "6.3.9": false, "5.15.0-91-generic": false,
		"6.4-rc1": true, "": false, "x.y": false,
	} {
		if got := kernelAtLeast(rel, 6, 4); got != want {
			t.Errorf("kernelAtLeast(%q, 6, 4) = %v, want %v", rel, got, want)
		}
	}
}
