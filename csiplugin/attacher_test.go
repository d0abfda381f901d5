package csiplugin

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

const testNode = "node-1"

// listers returns CSIDriver and VolumeAttachment listers over indexers
// filled with objs.
func listers(t *testing.T, objs ...any) (storagelisters.CSIDriverLister, storagelisters.VolumeAttachmentLister) {
	t.Helper()
	drivers := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	attachments := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *storagev1.CSIDriver:
			err = drivers.Add(o)
		case *storagev1.VolumeAttachment:
			err = attachments.Add(o)
		default:
			t.Fatalf("listers: unexpected %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return storagelisters.NewCSIDriverLister(drivers), storagelisters.NewVolumeAttachmentLister(attachments)
}

func attachPlugin(t *testing.T, objs ...any) *plugin {
	t.Helper()
	dl, vl := listers(t, objs...)
	p, err := newPlugin(Config{RootDir: t.TempDir(), NodeName: testNode, CSIDriverLister: dl, VolumeAttachmentLister: vl, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func csiDriverObj(name string, mutate func(*storagev1.CSIDriver)) *storagev1.CSIDriver {
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if mutate != nil {
		mutate(d)
	}
	return d
}

func vaObj(spec *podvol.VolumeSpec, mutate func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	pv := spec.PVName
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: AttachmentName(spec.VolumeHandle, spec.Driver, testNode)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: spec.Driver, NodeName: testNode,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
	if mutate != nil {
		mutate(va)
	}
	return va
}

// exhausted sets the VolumeAttachment's attachError with code.
func exhausted(msg string, code codes.Code) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) {
		va.Status.AttachError = &storagev1.VolumeError{Message: msg, ErrorCode: ptr.To(int32(code))}
	}
}

// withPeriod sets the CSIDriver's nodeAllocatableUpdatePeriodSeconds.
func withPeriod(seconds int64) func(*storagev1.CSIDriver) {
	return func(d *storagev1.CSIDriver) { d.Spec.NodeAllocatableUpdatePeriodSeconds = &seconds }
}

func testSpec(driver string) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{
		Name: podvol.CSIVolumeName(driver, "vol-1"), PVName: "pv-1", Driver: driver, VolumeHandle: "vol-1",
		Mode: podvol.Filesystem, FSType: "ext4", AccessMode: "ReadWriteOnce",
	}
}

func TestAttachmentName(t *testing.T) {
	// printf 'vol-1csi.example.comnode-1' | sha256sum
	const want = "csi-b74c7fc125891ffa0d0f2e0d645733e3fae7fba3066e76500a771ea08be9da28"
	if got := AttachmentName("vol-1", "csi.example.com", testNode); got != want {
		t.Errorf("AttachmentName = %q, want %q", got, want)
	}
	// The plugin names its volumes' attachments so for its node
	// (volume.AttachmentNamer).
	e := newEnv(t, envOptions{})
	if got := e.p.AttachmentName(testSpec("csi.example.com")); got != want {
		t.Errorf("plugin's AttachmentName = %q, want %q", got, want)
	}
}

func TestWaitForAttach(t *testing.T) {
	const drv = "csi.example.com"
	spec := testSpec(drv)
	now := metav1.Now()
	no, yes := false, true
	tests := []struct {
		name     string
		spec     *podvol.VolumeSpec
		objs     []any
		want     map[string]string
		notReady bool
		limit    bool // a *volume.AttachLimitError
		errText  string
		kubelet  string // the kubelet's words for the error (volume.EventCause), if any
	}{
		{name: "attachRequired false: no VolumeAttachment needed",
			objs: []any{csiDriverObj(drv, func(d *storagev1.CSIDriver) { d.Spec.AttachRequired = &no })}},
		{name: "ephemeral: never attached",
			spec: &podvol.VolumeSpec{Name: "x", Driver: drv, VolumeHandle: "csi-abc", Ephemeral: true}},
		{name: "CSIDriver missing: attach required, VolumeAttachment missing",
			notReady: true, errText: "waiting for VolumeAttachment " + AttachmentName("vol-1", drv, testNode) + " of driver " + drv},
		{name: "attachRequired true, VolumeAttachment missing",
			objs:     []any{csiDriverObj(drv, func(d *storagev1.CSIDriver) { d.Spec.AttachRequired = &yes })},
			notReady: true, errText: "to be attached"},
		{name: "not attached yet",
			objs:     []any{vaObj(spec, nil)},
			notReady: true, errText: "to be attached"},
		{name: "attach error",
			objs: []any{vaObj(spec, func(va *storagev1.VolumeAttachment) {
				va.Status.AttachError = &storagev1.VolumeError{Message: "disk quota exceeded"}
			})},
			errText: "disk quota exceeded", kubelet: "disk quota exceeded"},
		{name: "ResourceExhausted, driver with an allocatable update period: the attach limit",
			objs:  []any{csiDriverObj(drv, withPeriod(60)), vaObj(spec, exhausted("too many disks", codes.ResourceExhausted))},
			limit: true, errText: `attaching volume "kubernetes.io/csi/csi.example.com^vol-1" (PV pv-1, driver csi.example.com) to node node-1 failed (VolumeAttachment ` +
				AttachmentName("vol-1", drv, testNode) + "): the node has reached the attach limit of driver csi.example.com (ResourceExhausted): too many disks",
			kubelet: "too many disks"},
		{name: "ResourceExhausted, driver without an allocatable update period: a plain attach error",
			objs:    []any{csiDriverObj(drv, nil), vaObj(spec, exhausted("too many disks", codes.ResourceExhausted))},
			errText: "(VolumeAttachment " + AttachmentName("vol-1", drv, testNode) + ", code ResourceExhausted): too many disks", kubelet: "too many disks"},
		{name: "ResourceExhausted, no CSIDriver: a plain attach error",
			objs:    []any{vaObj(spec, exhausted("too many disks", codes.ResourceExhausted))},
			errText: "code ResourceExhausted): too many disks"},
		{name: "another code, driver with a period: a plain attach error",
			objs:    []any{csiDriverObj(drv, withPeriod(60)), vaObj(spec, exhausted("no such disk", codes.NotFound))},
			errText: "code NotFound): no such disk", kubelet: "no such disk"},
		{name: "being deleted",
			objs: []any{vaObj(spec, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = &now
				va.Finalizers = []string{"x"}
				va.Status.Attached = true
			})},
			errText: "being deleted", kubelet: "volume attachment is being deleted"},
		{name: "attached with metadata",
			objs: []any{vaObj(spec, func(va *storagev1.VolumeAttachment) {
				va.Status.Attached = true
				va.Status.AttachmentMetadata = map[string]string{"devicePath": "/dev/xvdb"}
			})},
			want: map[string]string{"devicePath": "/dev/xvdb"}},
		{name: "attached without metadata: empty, non-nil publish context",
			objs: []any{vaObj(spec, func(va *storagev1.VolumeAttachment) { va.Status.Attached = true })},
			want: map[string]string{}},
		{name: "hostile driver name",
			spec:    &podvol.VolumeSpec{Name: "x", Driver: "../etc", VolumeHandle: "h"},
			errText: "invalid driver name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := attachPlugin(t, tt.objs...)
			s := spec
			if tt.spec != nil {
				s = tt.spec
			}
			got, err := p.WaitForAttach(context.Background(), s)
			if tt.errText == "" {
				if err != nil {
					t.Fatalf("WaitForAttach: %v", err)
				}
				if (got == nil) != (tt.want == nil) || len(got) != len(tt.want) || got["devicePath"] != tt.want["devicePath"] {
					t.Fatalf("WaitForAttach = %#v, want %#v", got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("WaitForAttach = %v, want an error containing %q", got, tt.errText)
			}
			if !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("error %q does not contain %q", err, tt.errText)
			}
			if _, cause := volume.EventCause(err); tt.kubelet != "" && cause != tt.kubelet {
				t.Errorf("the kubelet's words %q, want %q", cause, tt.kubelet)
			}
			if errors.Is(err, volume.ErrNotReady) != tt.notReady {
				t.Errorf("errors.Is(err, ErrNotReady) = %v, want %v (%v)", !tt.notReady, tt.notReady, err)
			}
			var limit *volume.AttachLimitError
			if errors.As(err, &limit) != tt.limit {
				t.Errorf("errors.As(err, *AttachLimitError) = %v, want %v (%v)", !tt.limit, tt.limit, err)
			}
			if volume.IsUncertain(err) {
				t.Errorf("attach error %v is uncertain", err)
			}
		})
	}
}

// FuzzAttachmentName: whatever the handle, driver and node, the name is
// csi- and 64 hex digits (a valid object name), and always the same.
func FuzzAttachmentName(f *testing.F) {
	f.Add("vol-1", "csi.example.com", "node-1")
	f.Add("../x", "", "\x00")
	f.Add(strings.Repeat("h", 4096), "\xff\xfe", "\u202e")
	f.Fuzz(func(t *testing.T, handle, driver, node string) {
		name := AttachmentName(handle, driver, node)
		if !attachmentNameRE.MatchString(name) {
			t.Fatalf("AttachmentName(%q, %q, %q) = %q, not csi- and 64 hex digits", handle, driver, node, name)
		}
		if again := AttachmentName(handle, driver, node); again != name {
			t.Fatalf("AttachmentName is not deterministic: %q then %q", name, again)
		}
	})
}

var attachmentNameRE = regexp.MustCompile(`^csi-[0-9a-f]{64}$`)
