package volumemanager

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// lineLog is a logger that keeps the lines of the failure log (funcr's
// key="value" form, without timestamps).
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		keep := false
		for _, msg := range []string{"Volume operation failed", "Operation succeeded after failing", "Volume operation waiting"} {
			keep = keep || strings.Contains(args, `"msg"="`+msg+`"`)
		}
		if !keep {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, "["+prefix+"] "+args)
	}, funcr.Options{})
}

func (l *lineLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// TestFailingDriverLog captures the log of a driver that fails
// NodeStageVolume, then NodeUnstageVolume, with Internal, through a logger
// given to Run: every failure line names the operation, volume, driver,
// pods, error and the next retry (on the fake clock, which drives the
// retries); identical failures beyond the first five are rate-limited, a
// minute apart with the count of those not logged; a recovery has its
// line. Failed unstages are Warning events on the Node.
// The failure log's words (reconciler/faillog.go): a burst of five lines,
// then one a minute; the next retry's time with milliseconds.
const (
	failureLogBurst = 5
	rfc3339Milli    = "2006-01-02T15:04:05.000Z07:00"
)

func TestFailingDriverLog(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := fakeclock.NewFakeClock(t0)
	logs := &lineLog{}
	logger := logs.logger()
	events := record.NewFakeRecorder(100)
	events.IncludeObject = true
	e := newEnv(t, envOptions{clock: clk, logger: &logger, events: events})
	pv := e.claim("data")
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	drv := e.drv.DriverName()
	vol := "kubernetes.io/csi/" + drv + "^handle-data"
	stageErr := fmt.Sprintf(`mount_device failed for volume \"%s\" (driver %s): staging volume \"%s\" (PV %s, driver %s) at {root}/plugins/kubernetes.io/csi/%s/%s/globalmount: CSI NodeStageVolume of driver %s failed: rpc error: code = Internal desc = disk on fire`,
		vol, drv, vol, pv, drv, drv, "{sha}", drv)
	failLine := func(op, errText, pods string, wait time.Duration, at time.Duration, suppressed int) string {
		s := fmt.Sprintf(`[volumemanager] "msg"="Volume operation failed" "error"="%s" "operation"="%s" "volume"="%s" "driver"="%s" "pods"=%s "uncertain"=false "retryAfter"="%s" "nextRetry"="%s"`,
			errText, op, vol, drv, pods, wait, t0.Add(at+wait).Format(rfc3339Milli))
		if suppressed > 0 {
			s += fmt.Sprintf(` "suppressed"=%d`, suppressed)
		}
		return s
	}
	// norm puts placeholders where the lines have the test's root and
	// the staging directory's hash.
	norm := func(lines []string) []string {
		out := make([]string, len(lines))
		for i, l := range lines {
			l = strings.ReplaceAll(l, e.root, "{root}")
			if j := strings.Index(l, "/csi/"+drv+"/"); j >= 0 {
				k := j + len("/csi/"+drv+"/")
				if m := strings.Index(l[k:], "/globalmount"); m > 0 {
					l = l[:k] + "{sha}" + l[k+m:]
				}
			}
			out[i] = l
		}
		return out
	}
	// failures waits for the driver's n-th call of method and for the
	// loop to have taken its outcome in (its backoff timer armed).
	failures := func(method string, n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d calls of %s", n, method), func() bool { return e.drv.Calls(method) >= n })
		waitIdle(t, e.vm)
		if got := e.drv.Calls(method); got != n {
			t.Fatalf("%d calls of %s, want %d", got, method, n)
		}
	}

	e.drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "disk on fire")})
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	// Nine failures, each retry when its backoff ends (fake clock):
	// 500ms, 1s, 2s, ... 64s, then the cap, 2m2s.
	var want []string
	var at time.Duration
	wait := 500 * time.Millisecond
	for i := 1; i <= 9; i++ {
		failures("NodeStageVolume", i)
		switch {
		case i <= failureLogBurst: // the first five
			want = append(want, failLine("mount_device", stageErr, `["ns/web"]`, wait, at, 0))
		case i == 9: // 127.5s: a minute after the fifth (7.5s) and more
			want = append(want, failLine("mount_device", stageErr, `["ns/web"]`, wait, at, 3))
		}
		if got := norm(logs.get()); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("after failure %d, log:\n%s\nwant\n%s", i, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if i < 9 {
			clk.Step(wait)
			at += wait
			wait = min(2*wait, 2*time.Minute+2*time.Second)
		}
	}
	e.drv.ClearFaults()
	clk.Step(wait)
	at += wait
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	want = append(want, fmt.Sprintf(`[volumemanager] "level"=0 "msg"="Operation succeeded after failing" "operation"="mount_device" "volume"="%s" "driver"="%s" "pod"="ns/web" "failures"=9`, vol, drv))
	if got := norm(logs.get()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after the recovery, log:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for len(events.Events) > 0 {
		<-events.Events
	}

	// Unstage fails: the pod is gone, the Node gets the event.
	e.drv.Inject(csitest.Fault{Method: "NodeUnstageVolume", Err: status.Error(codes.Internal, "device busy")})
	e.vm.DeletePod(pod)
	failures("NodeUnstageVolume", 1)
	unstageErr := fmt.Sprintf(`unmount_device failed for volume \"%s\" (driver %s): `, vol, drv)
	got := norm(logs.get())[len(want):]
	if len(got) != 1 || !strings.HasPrefix(got[0], `[volumemanager] "msg"="Volume operation failed" "error"="`+unstageErr) ||
		!strings.Contains(got[0], `rpc error: code = Internal desc = device busy" "operation"="unmount_device" "volume"="`+vol+`" "driver"="`+drv+`" "pods"=[] "uncertain"=false "retryAfter"="500ms" "nextRetry"="`+t0.Add(at+500*time.Millisecond).Format(rfc3339Milli)+`"`) {
		t.Fatalf("unstage failure, log:\n%s", strings.Join(got, "\n"))
	}
	select {
	case ev := <-events.Events:
		// The kubelet's words, as its log says them: the PV's name and the
		// driver's error as the kubelet's CSI plugin wraps it.
		want := fmt.Sprintf(`Warning FailedUnMount UnmountDevice failed for volume %q : kubernetes.io/csi: attacher.UnmountDevice failed: `+
			`rpc error: code = Internal desc = device busy involvedObject{kind=Node,apiVersion=v1}`, pv)
		if ev != want {
			t.Errorf("event %q\nwant  %q", ev, want)
		}
	default:
		t.Error("no event for the failed unstage")
	}
	e.drv.ClearFaults()
	clk.Step(500 * time.Millisecond)
	failures("NodeUnstageVolume", 2)
	got = norm(logs.get())[len(want)+1:]
	if wantLine := fmt.Sprintf(`[volumemanager] "level"=0 "msg"="Operation succeeded after failing" "operation"="unmount_device" "volume"="%s" "driver"="%s" "pod"="" "failures"=1`, vol, drv); len(got) != 1 || got[0] != wantLine {
		t.Errorf("unstage recovery, log:\n%s\nwant\n%s", strings.Join(got, "\n"), wantLine)
	}
}

// TestWaitingLog: an attach-required volume whose VolumeAttachment the
// attacher has not attached yet is waiting, not failing: an info line (no
// error) with the reason and the next retry, and no Warning event on the
// pod, before and after the attacher has attached it.
func TestWaitingLog(t *testing.T) {
	logs := &lineLog{}
	logger := logs.logger()
	e := newEnv(t, envOptions{attachRequired: true, logger: &logger})
	pv := e.claim("data")
	drv := e.drv.DriverName()
	vol := "kubernetes.io/csi/" + drv + "^handle-data"
	vaName := csiplugin.AttachmentName("handle-data", drv, node)
	va := csitest.VolumeAttachment(vaName, drv, pv, node, false)
	e.create(va)
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a waiting line", func() bool { return len(logs.get()) > 0 })
	got := logs.get()
	if !strings.HasPrefix(got[0], `[volumemanager] "level"=0 "msg"="Volume operation waiting" "operation"="verify_controller_attached_volume" "volume"="`+vol+`" "driver"="`+drv+`" "pods"=["ns/web"] "uncertain"=false "retryAfter"="500ms" "nextRetry"=`) ||
		!strings.Contains(got[0], `"reason"="`) || !strings.Contains(got[0], vaName) || !strings.Contains(got[0], "not ready") {
		t.Fatalf("first line %q, want an info line naming the operation, volume, driver, pod, next retry and the VolumeAttachment it waits for", got[0])
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, l := range logs.get() {
		if strings.Contains(l, "Volume operation failed") {
			t.Errorf("a waiting attach logged as a failure: %s", l)
		}
	}
	select {
	case ev := <-e.events.Events:
		t.Errorf("event %q for an attach that was only waited for", ev)
	default:
	}
}
