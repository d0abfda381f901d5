package kubeletfork_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/internal/roottest"
)

// What the reader pod's volumes hold, and how long its token lives (the
// least the API server accepts).
const (
	realHostFile  = "from-the-host"
	realLocalFile = "from-the-local-pv"
	tokenSeconds  = 600
)

// realEnv is forkEnv on a real container runtime.
type realEnv struct {
	*forkEnv
	rt *realnode.Runtime
	p  *kubelettest.Process
	// hostDir is the reader pod's hostPath, localDir its local PV's path.
	hostDir, localDir string
}

// mountSpec is one volume of the reader pod: where its container sees it,
// and the subPath it also sees at {path}-sub.
type mountSpec struct {
	vol     v1.Volume
	path    string
	subPath string
}

// readerMounts are the reader pod's volumes, one of each kind, each also
// mounted by subPath: a configMap, a secret, a projected service account
// token of tokenSeconds, a downwardAPI file, an emptyDir on disk and one
// in memory, a hostPath, a local PV, a loop-driver claim and an inline
// loop-driver volume (the kube-api-access volume is added by admission).
func readerMounts(claim, localClaim, hostDir string) []mountSpec {
	secs := int64(tokenSeconds)
	dirOrCreate := v1.HostPathDirectoryOrCreate
	return []mountSpec{
		{v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: e2eCM}}}}, "/config", e2eCMKey},
		{v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: e2eSecret}}}, "/creds", e2eSecKey},
		{v1.Volume{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{
			ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &secs}}}}}}, "/token", "token"},
		{v1.Volume{Name: "podinfo", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{{
			Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}}, "/podinfo", "name"},
		{v1.Volume{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, "/cache", "sub"},
		{v1.Volume{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}}, "/mem", "sub"},
		{v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: hostDir, Type: &dirOrCreate}}}, "/host", "sub"},
		{v1.Volume{Name: "local", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: localClaim}}}, "/local", "sub"},
		{v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}, "/data", "sub"},
		{v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{
			Driver: e2eDriver, VolumeAttributes: map[string]string{"size": "32Mi"}}}}, "/scratch", "sub"},
	}
}

// writerScript is the reader pod's command: every 100 ms it counts, and
// writes the count into the disk emptyDir, the memory emptyDir, the claim
// and the inline volume, each through its subPath too (a file replaced by
// a rename, so that a reader never sees half a number); it exits at
// SIGTERM.
const writerScript = `trap 'exit 0' TERM
i=0
while true; do
  i=$((i+1))
  for d in /cache /cache-sub /mem /mem-sub /data /data-sub /scratch /scratch-sub /local-sub /host-sub; do
    echo $i > $d/count.tmp && mv $d/count.tmp $d/count
  done
  sleep 0.1
done`

// TestForkRealContainers runs the fork on containerd and runc (package
// realnode, images built here) against a real API server, with the loop
// driver and its registrar, and checks from inside the containers what
// the fake runtime cannot show:
//   - a container reads each kind of volume, and each through a subPath
//     (bind mounts the kubelet's own code makes on a real runtime, below
//     pods/{uid}/volume-subpaths), and writes into the emptyDirs, the
//     claim and the inline volume;
//   - a container does not start until its volumes are mounted: a pod
//     whose configMap is missing gets the kubelet's FailedMount event and
//     no sandbox, and starts once the configMap exists;
//   - exit codes: a container that checks its volume and exits 0 makes the
//     pod Succeeded, one that exits 3 makes it Failed with exit code 3;
//   - a configMap update reaches the container, and its projected token is
//     rotated at 80% of its life, seen from inside;
//   - the fork SIGKILLed and restarted while the containers run: they go on
//     reading and writing, never restarted, with the same mounts;
//   - deleting the pods leaves nothing: no mount, loop device, pod
//     directory, sandbox or container.
func TestForkRealContainers(t *testing.T) {
	roottest.Require(t)
	begin := time.Now()
	rt := realnode.StartT(t, realnode.Options{})
	fe, registrar, sock := startForkEnv(t, rt.Endpoint)
	e := &realEnv{forkEnv: fe, rt: rt, hostDir: filepath.Join(fe.scratch, "host"), localDir: filepath.Join(fe.scratch, "local-disk")}
	t.Logf("containerd, the binaries and the API server started in %v", time.Since(begin).Round(time.Millisecond))
	var ready time.Duration
	e.p, ready = e.startFork()
	t.Logf("the fork: Node Ready %v after its start", ready.Round(time.Millisecond))
	e.waitSourcesReady(e.p, 1)
	kubelettest.StartProcess(t, e.scratch, "registrar", []string{registrar,
		"--reg-path", filepath.Join(e.kubelet.Root, "plugins_registry"), "--driver-name", e2eDriver, "--endpoint", sock})
	ctx := t.Context()

	// The reader pod, first: its token's rotation is what the test waits
	// for longest, so everything else is checked meanwhile.
	pv := e.boundClaim(ctx, "data")
	localPV := e.localClaim(ctx, "local")
	if err := os.MkdirAll(filepath.Join(e.hostDir), 0o755); err != nil {
		t.Fatal(err)
	}
	for dir, content := range map[string]string{e.hostDir: realHostFile, e.localDir: realLocalFile} {
		if err := os.WriteFile(filepath.Join(dir, "file"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reader := e.createPod(ctx, e.readerPod("data", "local"))
	created := time.Now()
	e.waitRunning(reader)
	t.Logf("the reader pod: Running %v after its creation", time.Since(created).Round(time.Millisecond))
	readerID := e.containerID(reader, "reader")
	firstToken := e.exec(readerID, "cat", "/token/token")
	tokenSeen := time.Now()
	e.checkReader(reader, readerID, pv, localPV, e2eCMVal)
	e.checkSubPathMounts(reader, pv, localPV)

	// A configMap update reaches the container; the subPath file keeps
	// what it was mounted with, as on the kubelet.
	e.updateConfigMap(ctx, "v2")
	updated := time.Now()
	e.waitExec(readerID, "the configMap update inside the container", "v2", "cat", "/config/"+e2eCMKey)
	t.Logf("configMap update seen inside the container %v after the update", time.Since(updated).Round(time.Millisecond))
	if got := e.exec(readerID, "cat", "/config-sub"); got != e2eCMVal {
		t.Errorf("the configMap's subPath file holds %q after the update, want %q (a subPath is not updated)", got, e2eCMVal)
	}

	e.checkExitCodes(ctx)
	e.checkWaitsForVolumes(ctx)

	// The token, rotated at 80% of its life: the fork's resync finds it
	// due (every minute), so within a minute and a bit after that.
	rotated := e.waitToken(readerID, firstToken, tokenSeen)
	e.checkRotation(firstToken, rotated)

	// The fork SIGKILLed and started again while the reader runs.
	e.checkSurvivesKill(reader, readerID)

	// Deleted: nothing left.
	e.deleteAll(ctx, []*v1.Pod{reader}, pv)
	t.Logf("the whole test: %v", time.Since(begin).Round(time.Millisecond))
}

// readerPod is the reader pod (hostNetwork: the node's network is the
// host's loopback) with readerMounts mounted at their paths and their
// subPaths at {path}-sub, running writerScript.
func (e *realEnv) readerPod(claim, localClaim string) *v1.Pod {
	c := v1.Container{Name: "reader", Image: realnode.BusyboxImage, ImagePullPolicy: v1.PullNever,
		Command: []string{"sh", "-c", writerScript}}
	var vols []v1.Volume
	for _, m := range readerMounts(claim, localClaim, e.hostDir) {
		vols = append(vols, m.vol)
		c.VolumeMounts = append(c.VolumeMounts,
			v1.VolumeMount{Name: m.vol.Name, MountPath: m.path},
			v1.VolumeMount{Name: m.vol.Name, MountPath: m.path + "-sub", SubPath: m.subPath})
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e2eNS, Name: "reader", Labels: map[string]string{"app": "reader"}},
		Spec: v1.PodSpec{NodeName: e2eNode, HostNetwork: true, Containers: []v1.Container{c}, Volumes: vols,
			TerminationGracePeriodSeconds: ptr(int64(5))}}
}

func ptr[T any](v T) *T { return &v }

// checkReader checks, from inside the reader container, what each volume
// and each subPath holds.
func (e *realEnv) checkReader(pod *v1.Pod, id string, pv, localPV *v1.PersistentVolume, cm string) {
	e.t.Helper()
	want := map[string]string{
		"/config/" + e2eCMKey: cm, "/config-sub": cm,
		"/creds/" + e2eSecKey: e2eSecVal, "/creds-sub": e2eSecVal,
		"/podinfo/name": pod.Name, "/podinfo-sub": pod.Name,
		"/host/file": realHostFile, "/local/file": realLocalFile,
		"/var/run/secrets/kubernetes.io/serviceaccount/namespace": e2eNS,
		"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt":    strings.TrimSpace(string(e.nodeCfg.CAData)),
	}
	for path, content := range want {
		if got := e.exec(id, "cat", path); got != content {
			e.t.Errorf("inside the container, %s holds %q, want %q", path, got, content)
		}
	}
	for _, path := range []string{"/token/token", "/token-sub", "/var/run/secrets/kubernetes.io/serviceaccount/token"} {
		if claims := jwtClaims(e.t, e.exec(id, "cat", path)); claims.Pod.Name != pod.Name || claims.Pod.UID != string(pod.UID) {
			e.t.Errorf("inside the container, %s is a token bound to %+v, want pod %s (%s)", path, claims.Pod, pod.Name, pod.UID)
		}
	}
	// The writer counts in every writable volume and subPath; the
	// subPaths are the volumes' own directories, seen from the host.
	e.waitExec(id, "the writer's count in /data", "", "sh", "-c", "test -s /data/count && test -s /data-sub/count && test -s /cache-sub/count")
	for _, rel := range []string{"volumes/kubernetes.io~empty-dir/cache/sub/count", "volumes/kubernetes.io~csi/" + pv.Name + "/mount/sub/count"} {
		if _, err := os.Stat(filepath.Join(e.podDir(pod), rel)); err != nil {
			e.t.Errorf("the writer's count through a subPath is not in the volume: %v", err)
		}
	}
	for _, f := range []string{filepath.Join(e.hostDir, "sub", "count"), filepath.Join(e.localDir, "sub", "count")} {
		if _, err := os.Stat(f); err != nil {
			e.t.Errorf("the writer's count through a subPath: %v", err)
		}
	}
	// Read-only where the kubelet makes them so.
	for _, path := range []string{"/config", "/creds", "/token", "/podinfo"} {
		if out, err := e.execErr(id, "touch", path+"/x"); err == nil {
			e.t.Errorf("inside the container, %s is writable: %s", path, out)
		}
	}
}

// checkSubPathMounts checks the mount table under the fork's root: the
// volumes nodevol mounts, and one bind mount per subPath below
// pods/{uid}/volume-subpaths/{volume}/{container}/{index}, made by the
// kubelet's own code when it starts the container.
func (e *realEnv) checkSubPathMounts(pod *v1.Pod, pv, localPV *v1.PersistentVolume) {
	e.t.Helper()
	uids := map[string]string{string(pod.UID): pod.Name}
	got := e.mountTable(uids)
	want := []string{
		"plugins/kubernetes.io/csi/" + e2eDriver + "/*/globalmount ext4",
		"pods/reader/volumes/kubernetes.io~csi/" + pv.Name + "/mount ext4",
		"pods/reader/volumes/kubernetes.io~csi/scratch/mount ext4",
		"pods/reader/volumes/kubernetes.io~secret/creds tmpfs",
		"pods/reader/volumes/kubernetes.io~projected/token tmpfs",
		"pods/reader/volumes/kubernetes.io~projected/kube-api-access-* tmpfs",
		"pods/reader/volumes/kubernetes.io~downward-api/podinfo tmpfs",
		"pods/reader/volumes/kubernetes.io~empty-dir/mem tmpfs",
		"pods/reader/volumes/kubernetes.io~local-volume/" + localPV.Name + " " + fsType(e.t, e.localDir),
	}
	// The container's mounts in readerMounts' order, each volume then its
	// subPath: the subPath mount's index is its place in the list, its
	// directory the volume's name, the PV's for a claim.
	pvNames := map[string]string{"data": pv.Name, "local": localPV.Name}
	for i, m := range readerMounts("", "", "") {
		fs := map[string]string{"config": fsType(e.t, e.kubelet.Root), "creds": "tmpfs", "token": "tmpfs", "podinfo": "tmpfs",
			"cache": fsType(e.t, e.kubelet.Root), "mem": "tmpfs", "host": fsType(e.t, e.hostDir), "local": fsType(e.t, e.localDir),
			"data": "ext4", "scratch": "ext4"}[m.vol.Name]
		name := m.vol.Name
		if pvName, ok := pvNames[name]; ok {
			name = pvName
		}
		want = append(want, fmt.Sprintf("pods/reader/volume-subpaths/%s/reader/%d %s", name, 2*i+1, fs))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		e.t.Errorf("mounts under the fork's root:\ngot  %q\nwant %q", got, want)
	}
}

// fsType is the type of the file system dir is on.
func fsType(t *testing.T, dir string) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	switch st.Type {
	case 0xEF53:
		return "ext4"
	case 0x01021994:
		return "tmpfs"
	case 0x58465342:
		return "xfs"
	case 0x794c7630:
		return "overlay"
	}
	t.Fatalf("%s: file system type %#x unknown to the test", dir, st.Type)
	return ""
}

// checkExitCodes runs two pods that never restart: one checks its
// configMap from inside and exits 0 (Succeeded), one exits 3 (Failed,
// exit code 3 in its status).
func (e *realEnv) checkExitCodes(ctx context.Context) {
	e.t.Helper()
	pod := func(name, script string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e2eNS, Name: name},
			Spec: v1.PodSpec{NodeName: e2eNode, HostNetwork: true, RestartPolicy: v1.RestartPolicyNever,
				Containers: []v1.Container{{Name: "c", Image: realnode.BusyboxImage, ImagePullPolicy: v1.PullNever,
					Command: []string{"sh", "-c", script}, VolumeMounts: []v1.VolumeMount{{Name: "config", MountPath: "/config"}}}},
				Volumes: []v1.Volume{{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
					LocalObjectReference: v1.LocalObjectReference{Name: e2eCM}}}}}}}
	}
	ok := e.createPod(ctx, pod("succeeds", `test "$(cat /config/value)" = v2`))
	bad := e.createPod(ctx, pod("fails", "exit 3"))
	for _, c := range []struct {
		pod   *v1.Pod
		phase v1.PodPhase
		code  int32
	}{{ok, v1.PodSucceeded, 0}, {bad, v1.PodFailed, 3}} {
		got := e.waitPod(c.pod, "phase "+string(c.phase), func(p *v1.Pod) bool { return p.Status.Phase == c.phase })
		if st := got.Status.ContainerStatuses; len(st) != 1 || st[0].State.Terminated == nil || st[0].State.Terminated.ExitCode != c.code {
			e.t.Errorf("pod %s: container status %+v, want terminated with exit code %d", c.pod.Name, st, c.code)
		}
	}
	e.deleteAll(ctx, []*v1.Pod{ok, bad}, nil)
}

// checkWaitsForVolumes runs a pod whose configMap does not exist: it gets
// the kubelet's FailedMount event and no sandbox (the kubelet starts
// nothing before the volumes are mounted); once the configMap is
// created, its container starts and reads it.
func (e *realEnv) checkWaitsForVolumes(ctx context.Context) {
	e.t.Helper()
	const late = "late-config"
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e2eNS, Name: "waits"},
		Spec: v1.PodSpec{NodeName: e2eNode, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []v1.Container{{Name: "c", Image: realnode.BusyboxImage, ImagePullPolicy: v1.PullNever,
				Command:      []string{"sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"},
				VolumeMounts: []v1.VolumeMount{{Name: "cm", MountPath: "/cm"}}}},
			Volumes: []v1.Volume{{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
				LocalObjectReference: v1.LocalObjectReference{Name: late}}}}}}}
	pod = e.createPod(ctx, pod)
	want := fmt.Sprintf(`MountVolume.SetUp failed for volume "cm" : configmap %q not found`, late)
	e.waitFor(e.p, "the FailedMount event of pod waits", func() bool {
		evs, err := e.admin.CoreV1().Events(e2eNS).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "reason": "FailedMount"}.String()})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, want) {
				return true
			}
		}
		return false
	})
	if sbs := e.sandboxesOf(pod); len(sbs) > 0 {
		e.t.Errorf("pod waits has sandboxes %v while its volume is not mounted", sbs)
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: late}, Data: map[string]string{"k": "arrived"}}
	if _, err := e.admin.CoreV1().ConfigMaps(e2eNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitRunning(pod)
	if got := e.exec(e.containerID(pod, "c"), "cat", "/cm/k"); got != "arrived" {
		e.t.Errorf("pod waits reads %q, want %q", got, "arrived")
	}
	e.deleteAll(ctx, []*v1.Pod{pod}, nil)
}

// waitToken waits until the token the container reads differs from
// first, which it read at seen, and returns it.
func (e *realEnv) waitToken(id, first string, seen time.Time) string {
	e.t.Helper()
	deadline := seen.Add(tokenSeconds * time.Second)
	for {
		if tok := e.exec(id, "cat", "/token/token"); tok != first {
			e.t.Logf("the token rotated, seen from inside the container %v after the first was read", time.Since(seen).Round(time.Second))
			return tok
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the token was not rotated before it expired (%d s)", tokenSeconds)
		}
		select {
		case <-e.p.Exited():
			e.t.Fatalf("the fork exited (log %s)", e.p.Log())
		case <-time.After(time.Second):
		}
	}
}

// checkRotation checks the rotated token against the first: issued no
// sooner than 80% of the first's life (less the kubelet's 10 s of
// jitter) and before it expired, bound to the same pod.
func (e *realEnv) checkRotation(first, rotated string) {
	e.t.Helper()
	a, b := jwtClaims(e.t, first), jwtClaims(e.t, rotated)
	life := a.Exp - a.Iat
	if b.Iat < a.Iat+life*8/10-10 || b.Iat >= a.Exp {
		e.t.Errorf("the token was rotated %d s into its life of %d s, want from 80%% (%d s, less 10 s) and before it expired", b.Iat-a.Iat, life, life*8/10)
	}
	if a.Pod != b.Pod {
		e.t.Errorf("the rotated token is bound to %+v, the first to %+v", b.Pod, a.Pod)
	}
}

// checkSurvivesKill SIGKILLs the fork while the reader runs and starts
// it again: the container goes on counting, is never restarted, and the
// mounts under the root stay the same ones.
func (e *realEnv) checkSurvivesKill(pod *v1.Pod, id string) {
	e.t.Helper()
	before := e.mountIDs()
	count := func() int {
		n, err := strconv.Atoi(e.exec(id, "cat", "/data/count"))
		if err != nil {
			e.t.Fatal(err)
		}
		return n
	}
	n := count()
	if err := syscall.Kill(e.p.Pid(), syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	<-e.p.Exited()
	killed := time.Now()
	e.waitExecWithout(id, "the container counting on with the fork dead", fmt.Sprintf("test $(cat /data/count) -gt %d", n))
	e.p = e.kubelet.Start(e.t, "kubelet")
	e.waitFor(e.p, "the restarted fork's node lease", func() bool { return e.leaseRenewedAfter(killed) })
	e.waitSourcesReady(e.p, 2)
	n = count()
	e.waitExec(id, "the container counting on after the restart", "", "sh", "-c", fmt.Sprintf("test $(cat /data/count) -gt %d && test $(cat /cache/count) -gt %d", n, n))
	got := e.waitPod(pod, "Running after the restart", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	if st := got.Status.ContainerStatuses; len(st) != 1 || st[0].RestartCount != 0 || !strings.HasSuffix(st[0].ContainerID, id) {
		e.t.Errorf("after the fork's restart the container status is %+v, want container %s never restarted", st, id)
	}
	if after := e.mountIDs(); !slices.Equal(before, after) {
		e.t.Errorf("the restart changed the mounts:\nbefore %v\nafter  %v", before, after)
	}
	e.t.Logf("the fork killed and restarted; its pod sources were ready %v after the kill", time.Since(killed).Round(time.Millisecond))
}

func (e *realEnv) mountIDs() []string {
	ms, err := realnode.MountsUnder(e.kubelet.Root)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.ID+" "+m.Point)
	}
	return out
}

// deleteAll deletes pods and waits until each is gone from the API, its
// directory removed and its sandboxes gone from the runtime; then, if pv
// is set (the last pods of the test), checks that nothing is mounted
// under the root, no loop device is left and the claim was unstaged.
func (e *realEnv) deleteAll(ctx context.Context, pods []*v1.Pod, pv *v1.PersistentVolume) {
	e.t.Helper()
	start := time.Now()
	for _, pod := range pods {
		if err := e.admin.CoreV1().Pods(e2eNS).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			e.t.Fatalf("deleting pod %s: %v", pod.Name, err)
		}
	}
	for _, pod := range pods {
		e.waitFor(e.p, "pod "+pod.Name+" gone from the API", func() bool {
			_, err := e.admin.CoreV1().Pods(e2eNS).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		e.waitFor(e.p, "pod "+pod.Name+"'s directory removed", func() bool {
			_, err := os.Lstat(e.podDir(pod))
			return os.IsNotExist(err)
		})
	}
	e.t.Logf("pods %v deleted, gone from the API and their directories removed in %v", podNames(pods), time.Since(start).Round(time.Millisecond))
	// The kubelet's garbage collector removes a deleted pod's sandboxes
	// (every minute).
	e.waitForLong(e.p, 3*time.Minute, "the pods' sandboxes removed by the kubelet", func() bool {
		for _, pod := range pods {
			if len(e.sandboxesOf(pod)) > 0 {
				return false
			}
		}
		return true
	})
	if pv == nil {
		return
	}
	if got := e.mountTable(nil); len(got) > 0 {
		e.t.Errorf("mounts left under the fork's root: %q", got)
	}
	if devs := e.loopDevices(); len(devs) > 0 {
		e.t.Errorf("loop devices left: %v", devs)
	}
	if cs, err := e.rt.Containers(ctx); err != nil || len(cs) > 0 {
		e.t.Errorf("containers left in the runtime: %v, %v", cs, err)
	}
}

func podNames(pods []*v1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// sandboxesOf lists the runtime's sandboxes of pod, by the UID label the
// kubelet gives them.
func (e *realEnv) sandboxesOf(pod *v1.Pod) []string {
	e.t.Helper()
	resp, err := e.rt.CRI().ListPodSandbox(e.t.Context(), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)}}})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, s := range resp.Items {
		out = append(out, s.Id+" "+s.State.String())
	}
	return out
}

// localClaim creates a local PV on localDir, for this node, and a claim
// bound to it, as the PV controller would.
func (e *realEnv) localClaim(ctx context.Context, name string) *v1.PersistentVolume {
	e.t.Helper()
	if err := os.MkdirAll(e.localDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	return e.bindClaim(ctx, name, resource.MustParse("1Gi"), v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: e.localDir}},
		&v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{e2eNode}}}}}}})
}

// updateConfigMap sets the test's configMap's value.
func (e *realEnv) updateConfigMap(ctx context.Context, value string) {
	e.t.Helper()
	cm, err := e.admin.CoreV1().ConfigMaps(e2eNS).Get(ctx, e2eCM, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	cm.Data[e2eCMKey] = value
	if _, err := e.admin.CoreV1().ConfigMaps(e2eNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *realEnv) createPod(ctx context.Context, pod *v1.Pod) *v1.Pod {
	e.t.Helper()
	got, err := e.admin.CoreV1().Pods(e2eNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	return got
}

func (e *realEnv) waitRunning(pod *v1.Pod) {
	e.t.Helper()
	e.waitPod(pod, "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
}

// waitPod waits until pod satisfies cond, and returns it.
func (e *realEnv) waitPod(pod *v1.Pod, what string, cond func(*v1.Pod) bool) *v1.Pod {
	e.t.Helper()
	var got *v1.Pod
	e.waitFor(e.p, "pod "+pod.Name+" "+what, func() bool {
		p, err := e.admin.CoreV1().Pods(e2eNS).Get(e.t.Context(), pod.Name, metav1.GetOptions{})
		if err == nil && cond(p) {
			got = p
			return true
		}
		return false
	})
	return got
}

// containerID is the runtime's ID of pod's container name.
func (e *realEnv) containerID(pod *v1.Pod, name string) string {
	e.t.Helper()
	got := e.waitPod(pod, "with container "+name+" started", func(p *v1.Pod) bool {
		for _, st := range p.Status.ContainerStatuses {
			if st.Name == name && st.ContainerID != "" {
				return true
			}
		}
		return false
	})
	for _, st := range got.Status.ContainerStatuses {
		if st.Name == name {
			return strings.TrimPrefix(st.ContainerID, "containerd://")
		}
	}
	return ""
}

func (e *realEnv) podDir(pod *v1.Pod) string {
	return filepath.Join(e.kubelet.Root, "pods", string(pod.UID))
}

// exec runs cmd in container id and returns its output, trimmed; it fails
// the test if cmd fails.
func (e *realEnv) exec(id string, cmd ...string) string {
	e.t.Helper()
	out, err := e.execErr(id, cmd...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// execErr runs cmd in container id through the CRI (ExecSync).
func (e *realEnv) execErr(id string, cmd ...string) (string, error) {
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	resp, err := e.rt.CRI().ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 20})
	if err != nil {
		return "", fmt.Errorf("exec %q in container %s: %w", cmd, id, err)
	}
	out := strings.TrimSpace(string(resp.Stdout))
	if resp.ExitCode != 0 {
		return out, fmt.Errorf("exec %q in container %s: exit code %d: %s%s", cmd, id, resp.ExitCode, resp.Stdout, resp.Stderr)
	}
	return out, nil
}

// waitExec waits until cmd succeeds in container id with output want (any
// output if want is "").
func (e *realEnv) waitExec(id, what, want string, cmd ...string) {
	e.t.Helper()
	e.waitFor(e.p, what, func() bool {
		out, err := e.execErr(id, cmd...)
		return err == nil && (want == "" || out == want)
	})
}

// waitExecWithout waits, for up to a minute, until script succeeds in
// container id, while no kubelet runs.
func (e *realEnv) waitExecWithout(id, what, script string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := e.execErr(id, "sh", "-c", script)
		return err == nil, nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitForLong is forkEnv.waitFor with a longer limit than a minute.
func (e *realEnv) waitForLong(p *kubelettest.Process, limit time.Duration, what string, cond func() bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), limit)
	defer cancel()
	if err := p.WaitFor(ctx, what, cond); err != nil {
		e.t.Fatal(err)
	}
}

// tokenClaims are the claims of a service account token the test reads.
type tokenClaims struct {
	Iat, Exp int64
	Pod      struct{ Name, UID string }
}

// jwtClaims decodes a JWT's claims, without checking its signature (the
// API server checked it in checkReader's tokens when it issued them).
func jwtClaims(t *testing.T, token string) tokenClaims {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("%q is not a JWT", token)
	}
	data, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Iat, Exp int64
		K8s      struct {
			Pod struct{ Name, UID string } `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	return tokenClaims{Iat: raw.Iat, Exp: raw.Exp, Pod: raw.K8s.Pod}
}
