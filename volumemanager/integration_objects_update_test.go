package volumemanager

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/configmap"
)

// versionPayload is the content of version v of the latency test's file:
// big enough (64 KiB) that a write seen half done would show.
func versionPayload(v int) string {
	line := fmt.Sprintf("version %06d\n", v)
	return strings.Repeat(line, 64<<10/len(line))
}

// TestIntegrationConfigMapUpdateLatency updates a pod's configMap 50
// times through the API server, under the node's own credentials, and
// times each update from the Update call's return to the new content in
// the pod's file (read through the path a container sees, volume/key);
// it logs p50 and p99. A reader that reads the file all along never sees
// a mix of two versions, a short file or an older version after a newer.
func TestIntegrationConfigMapUpdateLatency(t *testing.T) {
	const updates = 50
	e := startObjectsEnv(t)
	ctx := t.Context()
	e.createObjects(t, map[string]map[string]string{"settings": {"data": versionPayload(0)}}, nil)
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		objectVolume("conf", "settings", "", false),
	}}))
	e.waitAuthorized(t, objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: objectsNS, Name: "settings"})
	e.mountPod(t, pod)
	file := filepath.Join(e.volumeDir(pod, pluginDir(configmap.PluginName), "conf"), "data")
	if got := readFile(file); got != versionPayload(0) {
		t.Fatalf("%s holds %d bytes, want version 0", file, len(got))
	}

	readerCtx, stopReader := context.WithCancel(ctx)
	reads, bad := make(chan int, 1), make(chan string, 1)
	go func() { r, b := readVersions(readerCtx, file); reads <- r; bad <- b }()

	latencies, fromCall := make([]time.Duration, 0, updates), make([]time.Duration, 0, updates)
	for v := 1; v <= updates; v++ {
		sent := time.Now()
		cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectsNS, Name: "settings"}, Data: map[string]string{"data": versionPayload(v)}}
		if _, err := e.admin.CoreV1().ConfigMaps(objectsNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		updated := time.Now()
		want := versionPayload(v)[:len("version 000000")]
		if err := pollFile(ctx, file, want, 5*time.Second); err != nil {
			t.Fatalf("update %d: %v", v, err)
		}
		latencies, fromCall = append(latencies, time.Since(updated)), append(fromCall, time.Since(sent))
	}
	stopReader()
	if n, b := <-reads, <-bad; b != "" || n == 0 {
		t.Errorf("the reader, after %d reads: %q", n, b)
	} else {
		t.Logf("the reader read the file %d times, every time one whole version, never an older one after a newer", n)
	}
	t.Logf("%d configMap updates, to the new content in the pod's file: from the Update call's return %s; from the call %s",
		updates, percentiles(latencies), percentiles(fromCall))
	if got := e.log.requests("configmaps"); len(got) != 1 || !got[0].initial {
		t.Errorf("requests of configMaps for 50 updates: %v, want 1 (a watch-list request)", got)
	}
}

// percentiles formats the p50, p99 and max of ds (sorted in place).
func percentiles(ds []time.Duration) string {
	slices.Sort(ds)
	pct := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1)+0.5)].Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %v, p99 %v, max %v", pct(0.50), pct(0.99), pct(1))
}

// pollFile waits until the file's first bytes are prefix, checking every
// 200 µs (a watch on the file system would see the rename of the
// directory's ..data link, not the file a container reads), for at most
// timeout.
func pollFile(ctx context.Context, path, prefix string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
	buf := make([]byte, len(prefix))
	for {
		if f, err := os.Open(path); err == nil {
			n, _ := io.ReadFull(f, buf)
			f.Close()
			if string(buf[:n]) == prefix {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not start with %q: %w", path, prefix, ctx.Err())
		case <-tick.C:
		}
	}
}

// readVersions reads the file until ctx ends and returns the number of
// reads and what was wrong with the first bad one: a read that failed,
// that is not one whole version, or that is older than one before it.
func readVersions(ctx context.Context, path string) (reads int, bad string) {
	last := 0
	for ctx.Err() == nil {
		b, err := os.ReadFile(path)
		if err != nil {
			return reads, fmt.Sprintf("read %d: %v", reads, err)
		}
		var v int
		if _, err := fmt.Sscanf(string(b), "version %06d\n", &v); err != nil || string(b) != versionPayload(v) {
			return reads, fmt.Sprintf("read %d: %d bytes, not one whole version (%v)", reads, len(b), err)
		}
		if v < last {
			return reads, fmt.Sprintf("read %d: version %d after %d", reads, v, last)
		}
		last = v
		reads++
	}
	return reads, ""
}

// TestIntegrationObjectCreatedLate: a pod's configMap volume whose
// configMap does not exist yet fails to be set up, and backs off; the
// configMap's creation (seen through the watch) sets it up at once, not
// when the backoff ends.
func TestIntegrationObjectCreatedLate(t *testing.T) {
	e := startObjectsEnv(t)
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		objectVolume("conf", "late", "", false),
	}}))
	e.waitAuthorized(t, objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: objectsNS, Name: "late"})
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	// Failed a few times: the next attempt is seconds away.
	name := podvol.UniqueVolumeName(configmap.PluginName + "/" + string(pod.UID) + "-conf")
	var retryAt time.Time
	var lastErr error
	eventually30s(t, "the volume backing off for 3 s", func() bool {
		retryAt, lastErr = backoffUntil(e.vm, name)
		return time.Until(retryAt) >= 3*time.Second
	})
	if want := `configmap "late" not found`; lastErr == nil || !strings.Contains(lastErr.Error(), want) {
		t.Fatalf("the volume's failure before the configMap exists: %v, want an error saying %s", lastErr, want)
	}

	e.createObjects(t, map[string]map[string]string{"late": {"mode": "one"}}, nil)
	created := time.Now()
	ctx, cancel := context.WithDeadline(t.Context(), retryAt.Add(-time.Second))
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatalf("the configMap created %v before the volume's next attempt, not set up 1 s before that attempt: %v", retryAt.Sub(created).Round(time.Millisecond), err)
	}
	t.Logf("set up %v after the configMap's creation (the backoff would have waited %v)",
		time.Since(created).Round(time.Millisecond), retryAt.Sub(created).Round(time.Millisecond))
	if got := readFile(filepath.Join(e.volumeDir(pod, pluginDir(configmap.PluginName), "conf"), "mode")); got != "one" {
		t.Errorf("mode = %q, want one", got)
	}
}

// eventually30s is eventually with a 30 s deadline (a backoff that takes
// seconds to grow).
func eventually30s(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}
