package kubeletbench

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The hand-over of pods that carry every kind of volume nodevol handles
// besides CSI, and a subPath into two of them: an emptyDir on disk and
// one in memory (a tmpfs), a configMap, a secret (a tmpfs), a projected
// volume as the API server injects for a service account
// (kube-api-access: a token, the kube-root-ca.crt configMap, the
// namespace; a tmpfs), a downwardAPI volume, and a claim of the loop
// driver and an inline ephemeral volume of it, with the pod's fsGroup
// applied to each.

const kindsFSGroup = 2000

// kindDirs are the kind volumes' plugin directories under
// pods/{uid}/volumes, by the volume's name in the pod.
var kindDirs = map[string]string{
	"scratch": "kubernetes.io~empty-dir",
	"mem":     "kubernetes.io~empty-dir",
	"conf":    "kubernetes.io~configmap",
	"creds":   "kubernetes.io~secret",
	"api":     "kubernetes.io~projected",
	"info":    "kubernetes.io~downward-api",
	"eph":     "kubernetes.io~csi",
}

// kindsObjects makes the configMaps and the secret the pods read.
func (e *hvEnv) kindsObjects() {
	e.configMaps = []*v1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"app.conf": "version=1\n"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "the cluster's CA\n"}},
	}
	e.secrets = []*v1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"}, Data: map[string][]byte{"password": []byte("hunter2")}}}
	// As a driver with inline volumes is deployed: the kubelet then says
	// csi.storage.k8s.io/ephemeral=true.
	e.podInfo = true
}

// kindsPod makes a pod of the claim v and a volume of each kind, with
// subPath mounts into the emptyDir on disk and into the claim.
func (e *hvEnv) kindsPod(name string, v *hvVolume) *hvPod {
	p := e.pod(name, v)
	fsGroup, expiry, mode, ext4 := int64(kindsFSGroup), int64(3607), int32(0o644), "ext4"
	p.pod.Labels = map[string]string{"app": name}
	spec := &p.pod.Spec
	spec.ServiceAccountName = "default"
	spec.SecurityContext = &v1.PodSecurityContext{FSGroup: &fsGroup}
	field := func(path string) *v1.ObjectFieldSelector {
		return &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}
	}
	spec.Volumes = append(spec.Volumes,
		v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		v1.Volume{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
		v1.Volume{Name: "conf", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "settings"}, DefaultMode: &mode}}},
		v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "db", DefaultMode: &mode}}},
		v1.Volume{Name: "api", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: &mode, Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: field("metadata.namespace")}}}},
		}}}},
		v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{DefaultMode: &mode, Items: []v1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: field("metadata.name")}, {Path: "labels", FieldRef: field("metadata.labels")}}}}},
		// With an fsType, as both sides apply the fsGroup to an inline
		// volume only then.
		v1.Volume{Name: "eph", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: v.driver.name, FSType: &ext4,
			VolumeAttributes: map[string]string{"size": "32Mi"}}}},
	)
	c := &spec.Containers[0]
	for _, name := range slices.Sorted(maps.Keys(kindDirs)) {
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: name, MountPath: "/" + name})
	}
	c.VolumeMounts = append(c.VolumeMounts,
		v1.VolumeMount{Name: "scratch", MountPath: "/sub", SubPath: "sub/dir"},
		v1.VolumeMount{Name: "v-" + v.name, MountPath: "/csisub", SubPath: "csi-sub"})
	return p
}

// kindPath is the pod's volume of that name (one of kindDirs).
func (e *hvEnv) kindPath(p *hvPod, name string) string {
	return filepath.Join(e.root, "pods", string(p.uid()), "volumes", kindDirs[name], name)
}

// kindsData are the files the test writes, by path, for the pod whose
// subPath bind mounts are binds: into each emptyDir, and through each
// subPath's bind mount (read back inside the volume too).
func (e *hvEnv) kindsData(p *hvPod, binds []string) map[string]string {
	data := map[string]string{}
	for _, name := range []string{"scratch", "mem"} {
		data[filepath.Join(e.kindPath(p, name), "data.txt")] = fmt.Sprintf("written by pod %s into %s\n", p.name, name)
	}
	data[filepath.Join(e.inlineTarget(p), "data.txt")] = fmt.Sprintf("written by pod %s into its inline volume\n", p.name)
	inside := []string{filepath.Join(e.kindPath(p, "scratch"), "sub", "dir"), filepath.Join(e.target(p, p.vols[0]), "csi-sub")}
	for i, b := range binds {
		text := fmt.Sprintf("written by pod %s through subPath bind mount %d\n", p.name, i)
		data[filepath.Join(b, "via-subpath.txt")] = text
		data[filepath.Join(inside[i], "via-subpath.txt")] = text
	}
	return data
}

// writeKinds writes the data of kindsData, and the claims' data.
func (e *hvEnv) writeKinds(t *testing.T, binds map[*hvPod][]string) {
	t.Helper()
	for p, b := range binds {
		if len(b) != 2 {
			t.Fatalf("pod %s: subPath bind mounts %v, want 2", p.name, b)
		}
		for i, dir := range []string{"scratch", p.vols[0].pvName()} {
			// the container's volumeMounts: the claim's, the kinds', then the two subPaths
			wantPath := filepath.Join(e.root, "pods", string(p.uid()), "volume-subpaths", dir, "c", fmt.Sprint(1+len(kindDirs)+i))
			if b[i] != wantPath {
				t.Errorf("pod %s: subPath bind mount %d at %s, want %s", p.name, i, b[i], wantPath)
			}
		}
		for path, text := range e.kindsData(p, b) {
			if strings.Contains(path, "volume-subpaths") {
				continue // the same file as the one inside the volume
			}
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		e.writeData(t, []*hvPod{p})
	}
}

// checkKinds reads back what writeKinds wrote, and what the atomic-writer
// volumes hold: the secret, the projected token, CA and namespace, the
// pod's name, and the configMap's app.conf as conf.
func (e *hvEnv) checkKinds(t *testing.T, p *hvPod, binds []string, conf string) {
	t.Helper()
	want := e.kindsData(p, binds)
	want[filepath.Join(e.kindPath(p, "conf"), "app.conf")] = conf
	want[filepath.Join(e.kindPath(p, "creds"), "password")] = "hunter2"
	want[filepath.Join(e.kindPath(p, "api"), "ca.crt")] = "the cluster's CA\n"
	want[filepath.Join(e.kindPath(p, "api"), "namespace")] = "ns"
	want[filepath.Join(e.kindPath(p, "info"), "name")] = p.name
	want[filepath.Join(e.kindPath(p, "info"), "labels")] = fmt.Sprintf("app=%q", p.name)
	for path, text := range want {
		if got, err := os.ReadFile(path); err != nil || string(got) != text {
			t.Errorf("pod %s: %s: read %q, %v; want %q", p.name, rel(e.root, path), got, err, text)
		}
	}
	if tok, err := os.ReadFile(filepath.Join(e.kindPath(p, "api"), "token")); err != nil || !strings.HasPrefix(string(tok), "token-") {
		t.Errorf("pod %s: projected token %q, %v; want one issued", p.name, tok, err)
	}
	// The pod's fsGroup: the group of the emptyDirs', the claim's and the inline volume's roots
	// (set-group-ID) and of the atomic writer's files.
	for _, path := range []string{e.kindPath(p, "scratch"), e.kindPath(p, "mem"), e.target(p, p.vols[0]), e.inlineTarget(p),
		filepath.Join(e.kindPath(p, "conf"), "app.conf"), filepath.Join(e.kindPath(p, "creds"), "password")} {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil || st.Gid != kindsFSGroup ||
			(st.Mode&syscall.S_IFMT == syscall.S_IFDIR && st.Mode&syscall.S_ISGID == 0) {
			t.Errorf("pod %s: %s: group %d, mode %o, %v; want the fsGroup %d (set-group-ID on a directory)", p.name, rel(e.root, path), st.Gid, st.Mode, err, kindsFSGroup)
		}
	}
	e.checkData(t, []*hvPod{p})
}

// timestamped matches the atomic writer's timestamped directory names.
var timestamped = regexp.MustCompile(`\.\.[0-9]{4}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}\.[0-9]+`)

// kindsLayout is what the pod's volumes look like on disk, by path below
// the root: each entry's type and permission bits, owner and group, and
// a symlink's target; the roots of the emptyDirs, the claim and the
// inline volume, and
// every entry of the atomic-writer volumes. With normalize, the atomic
// writer's timestamped directory names are replaced by "..TS", to compare
// the layout of two writes.
func (e *hvEnv) kindsLayout(t *testing.T, p *hvPod, normalize bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(path string) {
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		entry := fmt.Sprintf("%v %d:%d", fs.FileMode(st.Mode&0o7777)|modeType(st.Mode), st.Uid, st.Gid)
		if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			target, err := os.Readlink(path)
			if err != nil {
				t.Fatal(err)
			}
			entry += " -> " + target
		}
		key := rel(e.root, path)
		if normalize {
			key, entry = timestamped.ReplaceAllString(key, "..TS"), timestamped.ReplaceAllString(entry, "..TS")
		}
		out[key] = entry
	}
	add(e.kindPath(p, "scratch"))
	add(e.kindPath(p, "mem"))
	add(e.target(p, p.vols[0]))
	add(e.inlineTarget(p))
	for _, name := range []string{"conf", "creds", "api", "info"} {
		err := filepath.WalkDir(e.kindPath(p, name), func(path string, _ fs.DirEntry, err error) error {
			if err == nil {
				add(path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// modeType is the fs.FileMode type bits of a stat mode.
func modeType(m uint32) fs.FileMode {
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	}
	return 0
}

// diffLayout describes how two layouts differ.
func diffLayout(got, want map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, string) bool) {
		for k, v := range got {
			yield(k, v)
		}
		for k, v := range want {
			yield(k, v)
		}
	}))) {
		if got[k] != want[k] {
			fmt.Fprintf(&b, "  %s: %q, want %q\n", k, got[k], want[k])
		}
	}
	return b.String()
}

// withoutAPI is a layout less the projected volume's, whose token the
// second side asks for anew (neither keeps the first side's token) and
// so writes again.
func withoutAPI(l map[string]string, p *hvPod) map[string]string {
	out := maps.Clone(l)
	for k := range out {
		if strings.Contains(k, filepath.Join(kindDirs["api"], "api")) {
			delete(out, k)
		}
	}
	return out
}

// updateSettings sets configMap settings' app.conf on the client.
func updateSettings(t *testing.T, client kubernetes.Interface, conf string) {
	t.Helper()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"app.conf": conf}}
	if _, err := client.CoreV1().ConfigMaps("ns").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitConf waits until the pod's conf volume holds conf, calling poke
// (which makes the side look at the pod again) meanwhile.
func (e *hvEnv) waitConf(t *testing.T, p *hvPod, conf string, poke func()) {
	t.Helper()
	path := filepath.Join(e.kindPath(p, "conf"), "app.conf")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := os.ReadFile(path)
		if err == nil && string(got) == conf {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: %s holds %q, %v; want %q", p.name, rel(e.root, path), got, err, conf)
		}
		poke()
		time.Sleep(20 * time.Millisecond)
	}
}
