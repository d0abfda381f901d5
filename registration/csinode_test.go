package registration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csi"
)

func TestSetNodeAttachMode(t *testing.T) {
	const key = ControllerManagedAttachDetachAnnotation
	tests := []struct {
		name        string
		annotations map[string]string
		selfAttach  bool
		want        map[string]string
		changed     bool
	}{
		{"controller, none yet", nil, false, map[string]string{key: "true"}, true},
		{"controller, set", map[string]string{key: "true", "a": "b"}, false, map[string]string{key: "true", "a": "b"}, false},
		{"controller, other value", map[string]string{key: "false"}, false, map[string]string{key: "true"}, true},
		{"self, set", map[string]string{key: "true", "a": "b"}, true, map[string]string{"a": "b"}, true},
		{"self, other value", map[string]string{key: "false"}, true, map[string]string{}, true},
		{"self, none", nil, true, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: tt.annotations}}
			if got := SetNodeAttachMode(node, tt.selfAttach); got != tt.changed {
				t.Errorf("changed = %v, want %v", got, tt.changed)
			}
			if diff := cmp.Diff(tt.want, node.Annotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAllocatableUpdatePeriod(t *testing.T) {
	tests := []struct {
		name    string
		seconds *int64
		want    time.Duration
		err     string
	}{
		{name: "unset", want: 0},
		{name: "minimum", seconds: ptr.To[int64](10), want: 10 * time.Second},
		{name: "an hour", seconds: ptr.To[int64](3600), want: time.Hour},
		{name: "below the minimum", seconds: ptr.To[int64](9), err: "CSIDriver d.example.com: nodeAllocatableUpdatePeriodSeconds 9 is out of range (at least 10 seconds)"},
		{name: "zero", seconds: ptr.To[int64](0), err: "nodeAllocatableUpdatePeriodSeconds 0 is out of range"},
		{name: "negative", seconds: ptr.To[int64](-5), err: "nodeAllocatableUpdatePeriodSeconds -5 is out of range"},
		{name: "overflows a Duration", seconds: ptr.To[int64](1 << 40), err: "is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := periodDriver("d.example.com", tt.seconds)
			got, err := allocatableUpdatePeriod(d)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("= %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if got, err := allocatableUpdatePeriod(nil); got != 0 || err != nil {
		t.Errorf("no CSIDriver: %v, %v", got, err)
	}
}

// TestRunCreatesCSINode: Run creates the CSINode before any driver
// registers, owned by the Node as the kubelet sets it and with the
// migrated-plugins annotation, and leaves an
// existing one as it is.
func TestRunCreatesCSINode(t *testing.T) {
	h, _, client, ctx := regTestSetup(t, true)
	ctx, cancel := context.WithCancel(ctx)
	w, err := client.StorageV1().CSINodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- h.Run(ctx) }()
	ev := <-w.ResultChan()
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run returned %v", err)
	}
	if ev.Type != watch.Added {
		t.Fatalf("event %v", ev.Type)
	}
	want := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "node-1",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "node-1", UID: "uid"}},
			Annotations: map[string]string{corev1.MigratedPluginsAnnotationKey: "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file," +
				"kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume"},
		},
	}
	got := ev.Object.(*storagev1.CSINode)
	got = &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: got.Name, OwnerReferences: got.OwnerReferences, Annotations: got.Annotations}, Spec: got.Spec}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CSINode (-want +got):\n%s", diff)
	}
}

// TestRunWaitsForTheNode: with no Node yet, Run retries (with backoff on
// its clock) and creates the CSINode once the Node exists.
func TestRunWaitsForTheNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	clk, done := runUntilRetry(t, ctx, client) // the first attempt failed: it waits 100 ms and up to a fifth more
	if _, err := client.StorageV1().CSINodes().Get(ctx, "node-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("CSINode without a Node: %v", err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := client.StorageV1().CSINodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(120 * time.Millisecond)
	ev := <-w.ResultChan()
	if cn := ev.Object.(*storagev1.CSINode); len(cn.OwnerReferences) != 1 || cn.OwnerReferences[0].UID != "u2" {
		t.Errorf("CSINode %+v", cn)
	}
	cancel()
	<-done
}

// runUntilRetry starts the Run of a handler of node-1 on client, with a
// fake clock, and returns once its first attempt at the CSINode has failed
// and it waits on that clock to retry.
func runUntilRetry(t *testing.T, ctx context.Context, client *fake.Clientset) (*clocktesting.FakeClock, <-chan error) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	dl := storagelisters.NewCSIDriverLister(toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{}))
	h, err := New(Config{Registry: csi.NewRegistry(csi.RegistryOptions{}), KubeClient: client, NodeName: "node-1", CSIDrivers: dl, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	for !clk.HasWaiters() { // a condition on the fake clock: Run waits on it to retry
		time.Sleep(time.Millisecond)
	}
	return clk, done
}

// TestRunQuietWhileTheNodeIsMissing: at a first start the Node is
// registered after Run begins; the wait for it logs nothing at the default
// verbosity (as the kubelet's CSINode initialization), while a real API
// failure is still logged as an error.
func TestRunQuietWhileTheNodeIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      error // of every CSINode create, until the Node exists
		wantError string
	}{
		{name: "node registered late"},
		{name: "API failure", fail: apierrors.NewForbidden(storagev1.Resource("csinodes"), "node-1", errors.New("no RBAC")), wantError: "no RBAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(0), ktesting.BufferLogs(true)))
			ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
			defer cancel()
			client := fake.NewClientset()
			if tc.fail != nil {
				if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u2"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				var failed atomic.Bool
				client.PrependReactor("create", "csinodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					if failed.Swap(true) {
						return false, nil, nil
					}
					return true, nil, tc.fail
				})
			}
			clk, done := runUntilRetry(t, ctx, client)
			if tc.fail == nil {
				if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u2"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			w, err := client.StorageV1().CSINodes().Watch(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			clk.Step(time.Second)
			<-w.ResultChan() // the CSINode, created at the second attempt
			cancel()
			<-done
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			errorLine := strings.Contains(logs, "ERROR")
			switch {
			case tc.wantError == "" && errorLine:
				t.Errorf("logs at the default verbosity while the Node was missing:\n%s\nwant no error", logs)
			case tc.wantError != "" && (!errorLine || !strings.Contains(logs, tc.wantError)):
				t.Errorf("logs after an API failure:\n%s\nwant an error saying %q", logs, tc.wantError)
			}
		})
	}
}

// refreshSetup registers driver "a.example.com" (NodeGetInfo answering
// max_volumes_per_node 5) with a handler whose refresher runs on a fake
// clock and reads the CSIDrivers of indexer drivers.
func refreshSetup(t *testing.T) (*Handler, *regTestDriver, *fake.Clientset, toolscache.Indexer, *clocktesting.FakeClock, context.Context) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid"}})
	reg := csi.NewRegistry(csi.RegistryOptions{})
	t.Cleanup(func() { reg.Close() })
	drivers := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h, err := New(Config{Registry: reg, KubeClient: client, NodeName: "node-1",
		CSIDrivers: storagelisters.NewCSIDriverLister(drivers), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	d := &regTestDriver{info: &csipb.NodeGetInfoResponse{NodeId: "n1", MaxVolumesPerNode: 5}}
	endpoint := startRegTestDriver(t, d)
	if err := h.RegisterPlugin(ctx, "a.example.com", endpoint, []string{"1.0.0"}); err != nil {
		t.Fatal(err)
	}
	return h, d, client, drivers, clk, ctx
}

func (d *regTestDriver) setMax(n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.info = &csipb.NodeGetInfoResponse{NodeId: "n1", MaxVolumesPerNode: n}
}

func allocatable(t *testing.T, ctx context.Context, client *fake.Clientset) *storagev1.VolumeNodeResources {
	t.Helper()
	cn, err := client.StorageV1().CSINodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := driverEntry(cn, "a.example.com")
	if e == nil {
		t.Fatalf("no driver entry in %+v", cn.Spec)
	}
	return e.Allocatable
}

// TestAllocatableRefresh steps the refresher (sync) on a fake clock: the
// count is read again one period after registration and every period
// after, at once after a ResourceExhausted, never without a period, and
// not with a period out of range.
func TestAllocatableRefresh(t *testing.T) {
	type step struct {
		noCSIDriver bool
		period      *int64 // the CSIDriver's nodeAllocatableUpdatePeriodSeconds
		max         *int64 // what NodeGetInfo answers from now; nil: as before
		advance     time.Duration
		exhausted   bool
		wantCount   int32         // 0: no allocatable
		wantNext    time.Duration // from the start; 0: nothing scheduled
	}
	p := ptr.To[int64]
	tests := []struct {
		name  string
		steps []step
	}{
		{"periodic", []step{
			{period: p(60), max: p(7), wantCount: 5, wantNext: 60 * time.Second},
			{period: p(60), advance: 59 * time.Second, wantCount: 5, wantNext: 60 * time.Second},
			{period: p(60), advance: time.Second, wantCount: 7, wantNext: 120 * time.Second},
			{period: p(60), max: p(0), advance: 60 * time.Second, wantNext: 180 * time.Second},
		}},
		{"resource exhausted", []step{
			{period: p(600), max: p(3), wantCount: 5, wantNext: 600 * time.Second},
			{period: p(600), exhausted: true, wantCount: 3, wantNext: 600 * time.Second},
		}},
		{"no CSIDriver: never", []step{
			{noCSIDriver: true, max: p(3), wantCount: 5},
			{noCSIDriver: true, advance: time.Hour, exhausted: true, wantCount: 5},
		}},
		{"no period: never", []step{
			{max: p(3), wantCount: 5},
			{advance: time.Hour, exhausted: true, wantCount: 5},
		}},
		{"period changed", []step{
			{period: p(60), max: p(7), wantCount: 5, wantNext: 60 * time.Second},
			{period: p(30), advance: 10 * time.Second, wantCount: 5, wantNext: 40 * time.Second},
			{period: p(30), advance: 30 * time.Second, wantCount: 7, wantNext: 70 * time.Second},
		}},
		{"out of range: not refreshed, not spinning", []step{
			{period: p(5), max: p(3), wantCount: 5},
			{period: p(0), advance: time.Hour, exhausted: true, wantCount: 5},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, d, client, drivers, clk, ctx := refreshSetup(t)
			start := clk.Now()
			for i, s := range tt.steps {
				_ = drivers.Delete(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "a.example.com"}})
				if !s.noCSIDriver {
					if err := drivers.Add(periodDriver("a.example.com", s.period)); err != nil {
						t.Fatal(err)
					}
				}
				if s.max != nil {
					d.setMax(*s.max)
				}
				clk.Step(s.advance)
				if s.exhausted {
					h.ResourceExhausted("a.example.com")
				}
				next := h.refresh.sync(ctx)
				var gotNext time.Duration
				if !next.IsZero() {
					gotNext = next.Sub(start)
				}
				if gotNext != s.wantNext {
					t.Errorf("step %d: next refresh at +%v, want +%v", i, gotNext, s.wantNext)
				}
				a := allocatable(t, ctx, client)
				switch {
				case s.wantCount == 0 && a != nil:
					t.Errorf("step %d: allocatable %+v, want none (NodeGetInfo said 0)", i, a)
				case s.wantCount != 0 && (a == nil || *a.Count != s.wantCount):
					t.Errorf("step %d: allocatable %+v, want count %d", i, a, s.wantCount)
				}
			}
		})
	}
}

// TestAllocatableRefreshRuns: Run refreshes on its own timer and after
// ResourceExhausted, and stops refreshing a deregistered driver.
func TestAllocatableRefreshRuns(t *testing.T) {
	h, d, client, drivers, clk, ctx := refreshSetup(t)
	if err := drivers.Add(periodDriver("a.example.com", ptr.To[int64](10))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	w, err := client.StorageV1().CSINodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// waitCount waits for the CSINode update that sets the count.
	waitCount := func(want int32) {
		t.Helper()
		for ev := range w.ResultChan() {
			e := driverEntry(ev.Object.(*storagev1.CSINode), "a.example.com")
			if e != nil && e.Allocatable != nil && *e.Allocatable.Count == want {
				return
			}
		}
	}
	for !clk.HasWaiters() { // the refresher's timer is armed (10 s)
		time.Sleep(time.Millisecond)
	}
	d.setMax(8)
	clk.Step(10 * time.Second)
	waitCount(8)
	d.setMax(9)
	h.ResourceExhausted("a.example.com")
	waitCount(9)
	if got := *allocatable(t, ctx, client).Count; got != 9 {
		t.Errorf("count %d", got)
	}
}

// periodDriver is a CSIDriver with nodeAllocatableUpdatePeriodSeconds
// seconds (nil: unset).
func periodDriver(name string, seconds *int64) *storagev1.CSIDriver {
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name}}
	d.Spec.NodeAllocatableUpdatePeriodSeconds = seconds
	return d
}
