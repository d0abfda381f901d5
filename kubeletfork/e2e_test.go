package kubeletfork_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/internal/roottest"
)

// e2ePods are the test's pods: a CSI claim, an inline ephemeral CSI
// volume of the loop driver, the object volumes (a configMap, a secret,
// a downwardAPI volume, an emptyDir) and a flexVolume of the script driver
// (bind-mounting flexSrc, with a secretRef); every one gets
// kube-api-access-* from the ServiceAccount admission plugin. suffix names
// a round.
func e2ePods(suffix, claim, flexSrc string) []*v1.Pod {
	pod := func(name string, vols ...v1.Volume) *v1.Pod {
		c := v1.Container{Name: "c", Image: kubelettest.Image, ImagePullPolicy: v1.PullIfNotPresent}
		for _, v := range vols {
			c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e2eNS, Name: name + suffix},
			Spec: v1.PodSpec{NodeName: e2eNode, HostNetwork: true, Containers: []v1.Container{c}, Volumes: vols}}
	}
	objects := pod("objects",
		v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: e2eCM}}}},
		v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: e2eSecret}}},
		v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}},
		v1.Volume{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	// The container also reads the configMap and the secret as env: the
	// kubelet resolves it through nodevol's object cache (the adapter's
	// ObjectManagers), so it starts only if that read works.
	objects.Spec.Containers[0].Env = []v1.EnvVar{{Name: "VALUE", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
		LocalObjectReference: v1.LocalObjectReference{Name: e2eCM}, Key: e2eCMKey}}}}
	objects.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{
		LocalObjectReference: v1.LocalObjectReference{Name: e2eSecret}}}}
	return []*v1.Pod{
		pod("claim", v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}),
		pod("inline", v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{
			Driver: e2eDriver, VolumeAttributes: map[string]string{"size": "32Mi"}}}}),
		objects,
		pod("flex", v1.Volume{Name: "share", VolumeSource: v1.VolumeSource{FlexVolume: &v1.FlexVolumeSource{
			Driver: e2eFlexDriver, SecretRef: &v1.LocalObjectReference{Name: e2eFlexSecret}, Options: map[string]string{"source": flexSrc}}}}),
	}
}

// wantMounts is the mount table under the fork's root with e2ePods
// running (see mountTable): ext4 on a loop device for the CSI volumes
// (the claim's staged and published, the inline one published), tmpfs for
// the secret, the downwardAPI and the projected volumes, the flexVolume's
// bind mount of its source (of flexFSType); the configMap and the emptyDir
// are directories on the root's disk, as the kubelet makes them.
func wantMounts(suffix, pv, flexFSType string) []string {
	want := []string{
		"pods/flex" + suffix + "/volumes/" + strings.ReplaceAll(e2eFlexDriver, "/", "~") + "/share " + flexFSType,
		"plugins/kubernetes.io/csi/" + e2eDriver + "/*/globalmount ext4",
		"pods/claim" + suffix + "/volumes/kubernetes.io~csi/" + pv + "/mount ext4",
		"pods/inline" + suffix + "/volumes/kubernetes.io~csi/scratch/mount ext4",
		"pods/objects" + suffix + "/volumes/kubernetes.io~secret/creds tmpfs",
		"pods/objects" + suffix + "/volumes/kubernetes.io~downward-api/info tmpfs",
	}
	for _, p := range []string{"claim", "inline", "objects", "flex"} {
		want = append(want, "pods/"+p+suffix+"/volumes/kubernetes.io~projected/kube-api-access-* tmpfs")
	}
	slices.Sort(want)
	return want
}

// TestForkRunsPodsOnNodevol runs the fork (the kubelet v1.37.2 with nodevol
// as its volume manager) as a node's kubelet against a real API server,
// with the loop driver registering through its plugins_registry: pods
// with a CSI claim, an inline CSI volume and the object volumes reach
// Running with their volumes mounted; deleted, everything is taken down
// and the pods go away; across a restart of the fork, running pods keep
// their mounts (the same mount IDs) and are then taken down as well. The
// fork's stats summary lists every volume of the pods, as the stock
// kubelet's does, before and after the restart.
func TestForkRunsPodsOnNodevol(t *testing.T) {
	roottest.Require(t)
	begin := time.Now()
	e, registrar, sock := startForkEnv(t, "")
	t.Logf("binaries built and the API server started in %v", time.Since(begin).Round(time.Millisecond))
	p, ready := e.startFork()
	t.Logf("the fork: Node Ready %v after its start", ready.Round(time.Millisecond))
	e.waitSourcesReady(p, 1)
	kubelettest.StartProcess(t, e.scratch, "registrar", []string{registrar,
		"--reg-path", filepath.Join(e.kubelet.Root, "plugins_registry"), "--driver-name", e2eDriver, "--endpoint", sock})

	// Round 1: created, checked, deleted.
	base := e.watches() // the API server's own
	r := e.createRound(p, "-1")
	r.check(p)
	e.checkObjectWatches(p, base)
	r.checkStats(p)
	r.delete(p)

	// Round 2: created, the fork restarted, checked, deleted.
	r = e.createRound(p, "-2")
	r.check(p)
	before := r.mountIDs()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	p = e.kubelet.Start(t, "kubelet")
	e.waitFor(p, "the restarted fork's node lease", func() bool { return e.leaseRenewedAfter(stopped) })
	e.waitSourcesReady(p, 2)
	t.Logf("the restarted fork renewed its lease and had its pod sources ready %v after the stop", time.Since(stopped).Round(time.Millisecond))
	r.checkRunning()
	r.check(p)
	r.checkStats(p)
	if after := r.mountIDs(); !slices.Equal(before, after) {
		t.Errorf("the restart changed the pods' mounts:\nbefore %v\nafter  %v", before, after)
	}
	r.delete(p)
	t.Logf("the whole test: %v", time.Since(begin).Round(time.Millisecond))
}

// sourcesReady is what the adapter logs once the kubelet's pod sources are
// ready, when nodevol may tear down the volumes that no pod wants: the
// restarted fork has read every pod and kept their mounts.
const sourcesReady = "Every pod source is ready"

// waitSourcesReady waits until the fork's log (appended to by each start)
// has sourcesReady n times: the adapter is the fork's volume manager.
func (e *forkEnv) waitSourcesReady(p *kubelettest.Process, n int) {
	e.t.Helper()
	e.waitFor(p, fmt.Sprintf("%q %d times in the fork's log", sourcesReady, n), func() bool {
		data, err := os.ReadFile(p.Log())
		return err == nil && bytes.Count(data, []byte(sourcesReady)) >= n
	})
}

// leaseRenewedAfter tells whether the node's lease was renewed after t.
func (e *forkEnv) leaseRenewedAfter(t time.Time) bool {
	l, err := e.admin.CoordinationV1().Leases("kube-node-lease").Get(e.t.Context(), e2eNode, metav1.GetOptions{})
	return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(t)
}

// round is one set of e2ePods with its claim.
type round struct {
	e      *forkEnv
	suffix string
	pv     *v1.PersistentVolume
	pods   []*v1.Pod
	uids   map[string]string
}

// createRound creates the round's claim and pods and waits for each pod
// to be Running, logging how long each took from its creation.
func (e *forkEnv) createRound(p *kubelettest.Process, suffix string) *round {
	e.t.Helper()
	ctx := e.t.Context()
	r := &round{e: e, suffix: suffix, uids: map[string]string{}}
	r.pv = e.boundClaim(ctx, "data"+suffix)
	created := map[string]time.Time{}
	for _, pod := range e2ePods(suffix, "data"+suffix, e.flexSrc) {
		got, err := e.admin.CoreV1().Pods(e2eNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("creating pod %s: %v", pod.Name, err)
		}
		created[got.Name] = time.Now()
		r.pods = append(r.pods, got)
		r.uids[string(got.UID)] = got.Name
	}
	for _, pod := range r.pods {
		e.waitFor(p, "pod "+pod.Name+" Running", func() bool {
			got, err := e.admin.CoreV1().Pods(e2eNS).Get(ctx, pod.Name, metav1.GetOptions{})
			return err == nil && got.Status.Phase == v1.PodRunning
		})
		e.t.Logf("pod %s: Running %v after its creation", pod.Name, time.Since(created[pod.Name]).Round(time.Millisecond))
	}
	return r
}

// check checks the mount table under the fork's root and the files of the
// object volumes.
func (r *round) check(p *kubelettest.Process) {
	e := r.e
	e.t.Helper()
	if got, want := e.mountTable(r.uids), wantMounts(r.suffix, r.pv.Name, e.flexFSType); !slices.Equal(got, want) {
		e.t.Errorf("mounts under the fork's root:\ngot  %q\nwant %q", got, want)
	}
	for _, pod := range r.pods {
		access := ""
		for _, v := range pod.Spec.Volumes {
			if accessName.MatchString(v.Name) {
				access = v.Name
			}
		}
		if access == "" {
			e.t.Fatalf("pod %s has no kube-api-access volume: %v", pod.Name, pod.Spec.Volumes)
		}
		want := map[string]string{
			"kubernetes.io~projected/" + access + "/ca.crt":    string(e.nodeCfg.CAData),
			"kubernetes.io~projected/" + access + "/namespace": e2eNS,
			"kubernetes.io~projected/" + access + "/token":     "",
		}
		if strings.HasPrefix(pod.Name, "objects") {
			want["kubernetes.io~configmap/config/"+e2eCMKey] = e2eCMVal
			want["kubernetes.io~secret/creds/"+e2eSecKey] = e2eSecVal
		}
		if strings.HasPrefix(pod.Name, "flex") { // the source's file, through the bind mount
			want[strings.ReplaceAll(e2eFlexDriver, "/", "~")+"/share/"+e2eFlexFile] = e2eFlexText
		}
		dir := r.volumesDir(pod)
		for f, content := range want {
			got, err := os.ReadFile(filepath.Join(dir, f))
			switch {
			case err != nil:
				e.t.Errorf("pod %s: %v", pod.Name, err)
			case content == "" && len(bytes.Split(got, []byte("."))) != 3:
				e.t.Errorf("pod %s: %s is not a JWT: %q", pod.Name, f, got)
			case content != "" && string(got) != content:
				e.t.Errorf("pod %s: %s holds %q, want %q", pod.Name, f, got, content)
			}
		}
		if strings.HasPrefix(pod.Name, "objects") {
			if st, err := os.Stat(filepath.Join(dir, "kubernetes.io~empty-dir", "cache")); err != nil || !st.IsDir() {
				e.t.Errorf("pod %s: the emptyDir: %v", pod.Name, err)
			}
		}
	}
}

// checkRunning checks that every pod of the round is Running.
func (r *round) checkRunning() {
	r.e.t.Helper()
	for _, pod := range r.pods {
		got, err := r.e.admin.CoreV1().Pods(e2eNS).Get(r.e.t.Context(), pod.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			r.e.t.Errorf("pod %s after the fork's restart: %v", pod.Name, err)
		case got.Status.Phase != v1.PodRunning:
			r.e.t.Errorf("pod %s after the fork's restart: phase %s, want Running", pod.Name, got.Status.Phase)
		}
	}
}

// volumesDir is pod's {root}/pods/{uid}/volumes.
func (r *round) volumesDir(pod *v1.Pod) string {
	return filepath.Join(r.e.kubelet.Root, "pods", string(pod.UID), "volumes")
}

// mountIDs are the IDs and points of the mounts under the fork's root,
// in mountinfo's order.
func (r *round) mountIDs() []string {
	ms, err := realnode.MountsUnder(r.e.kubelet.Root)
	if err != nil {
		r.e.t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.ID+" "+m.Point)
	}
	return out
}

// delete deletes the round's pods through the API and waits until the
// pod objects are gone (the kubelet's status manager deletes them once
// the volume manager says their volumes are), their directories are
// removed and nothing is mounted under the fork's root but the root; then
// checks that no loop device is left and the driver unpublished and
// unstaged each volume.
func (r *round) delete(p *kubelettest.Process) {
	e := r.e
	e.t.Helper()
	ctx := e.t.Context()
	start := time.Now()
	for _, pod := range r.pods {
		if err := e.admin.CoreV1().Pods(e2eNS).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			e.t.Fatalf("deleting pod %s: %v", pod.Name, err)
		}
	}
	for _, pod := range r.pods {
		e.waitFor(p, "pod "+pod.Name+" gone from the API", func() bool {
			_, err := e.admin.CoreV1().Pods(e2eNS).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		e.waitFor(p, "pod "+pod.Name+"'s directory removed", func() bool {
			_, err := os.Lstat(filepath.Dir(r.volumesDir(pod)))
			return os.IsNotExist(err)
		})
	}
	e.t.Logf("round %s: pods deleted, gone from the API and their directories removed in %v", r.suffix, time.Since(start).Round(time.Millisecond))
	if got := e.mountTable(nil); len(got) > 0 {
		e.t.Errorf("mounts left under the fork's root: %q", got)
	}
	if devs := e.loopDevices(); len(devs) > 0 {
		e.t.Errorf("loop devices left: %v", devs)
	}
	r.checkCalls()
}

// checkCalls checks the driver's call log: each CSI volume of the round
// was unpublished from its pod's target, and the claim's unstaged.
func (r *round) checkCalls() {
	e := r.e
	data, err := os.ReadFile(e.calls)
	if err != nil {
		e.t.Fatal(err)
	}
	var want []string
	for _, pod := range r.pods {
		switch {
		case strings.HasPrefix(pod.Name, "claim"):
			want = append(want, "NodeUnpublishVolume "+filepath.Join(r.volumesDir(pod), "kubernetes.io~csi", r.pv.Name, "mount"),
				"NodeUnstageVolume "+r.pv.Spec.CSI.VolumeHandle)
		case strings.HasPrefix(pod.Name, "inline"):
			want = append(want, "NodeUnpublishVolume "+filepath.Join(r.volumesDir(pod), "kubernetes.io~csi", "scratch", "mount"))
		}
	}
	seen := map[string]bool{}
	for line := range strings.Lines(string(data)) {
		if f := strings.Split(strings.TrimSpace(line), "\t"); len(f) == 4 {
			seen[f[0]+" "+f[1]], seen[f[0]+" "+f[2]] = true, true
		}
	}
	for _, call := range want {
		if !seen[call] {
			e.t.Errorf("the driver got no %s", call)
		}
	}
	r.checkFlexCalls()
}

// checkFlexCalls checks the flexVolume driver's call log: the flex pod's
// volume was mounted at its directory with the secret among the options,
// and unmounted.
func (r *round) checkFlexCalls() {
	e := r.e
	data, err := os.ReadFile(e.flexCalls)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, pod := range r.pods {
		if !strings.HasPrefix(pod.Name, "flex") {
			continue
		}
		dir := filepath.Join(r.volumesDir(pod), strings.ReplaceAll(e2eFlexDriver, "/", "~"), "share")
		for _, call := range []string{"mount " + dir + " secret", "unmount " + dir + " nosecret"} {
			if !strings.Contains(string(data), call+"\n") {
				e.t.Errorf("the flexVolume driver got no %q; its log:\n%s", call, data)
			}
		}
	}
}

// checkObjectWatches checks that the API server serves, beyond base (its
// own watches, before the pods), one watch per configMap and secret the
// node reads, whether a pod reads it as a volume, as env or both: the
// configMap and the secret of the objects pod, its namespace's
// kube-root-ca.crt (every kube-api-access volume), the flexVolume's
// secret. The stock kubelet's configMap and secret managers would watch
// each a second time beside nodevol's object cache.
func (e *forkEnv) checkObjectWatches(p *kubelettest.Process, base map[string]float64) {
	e.t.Helper()
	want := map[string]float64{"configmaps": 2, "secrets": 2}
	got := map[string]float64{}
	// A watch is counted once the API server serves it: opened before the
	// pods ran, its count may lag their phase by a moment.
	ctx, cancel := context.WithTimeout(e.t.Context(), time.Minute)
	defer cancel()
	err := p.WaitFor(ctx, "the API server's watches", func() bool {
		all := e.watches()
		for r := range want {
			got[r] = all[r] - base[r]
		}
		return got["configmaps"] == want["configmaps"] && got["secrets"] == want["secrets"]
	})
	if err != nil {
		e.t.Errorf("the API server serves %v watches of the node's, want one per object the node reads: %v (%v)", got, want, err)
	}
}

// watches is the API server's count of the watches it serves, by resource
// (apiserver_longrunning_requests).
func (e *forkEnv) watches() map[string]float64 {
	data, err := e.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(e.t.Context())
	if err != nil {
		e.t.Fatalf("reading the API server's metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		e.t.Fatalf("parsing the API server's metrics: %v", err)
	}
	got := map[string]float64{}
	for _, m := range families["apiserver_longrunning_requests"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["verb"] == "WATCH" {
			got[labels["resource"]] += m.GetGauge().GetValue()
		}
	}
	return got
}
