package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

// The volumes whose content nodevol writes, as the kubelet writes them:
// configMap, secret, downwardAPI and projected (the kube-api-access
// volume the API server adds to every pod). Their files are links through
// ..data to a timestamped directory; the secret, downwardAPI and projected
// volumes are tmpfs mounts sized by the pod's memory limit, the configMap
// volumes directories on disk; each is the directory of a wrapped emptyDir
// whose ready file is that of wrapped_{name}.

const (
	// contentMemory is the memory limit of the content pod's container:
	// its tmpfs mounts are of this size.
	contentMemory    = "256Mi"
	contentTmpfsSize = "size=262144k"
	contentMemBytes  = "268435456"
	contentAccess    = "kube-api-access-x7k2q"
	contentSA        = "default"
	contentCA        = "-----BEGIN CERTIFICATE-----\nMIIB the cluster CA\n-----END CERTIFICATE-----\n"
	contentTokenLife = 3607
)

// The content pod's volumes: name, plugin and escaped plugin name.
var contentKinds = []struct{ name, plugin, dir string }{
	{"conf", "kubernetes.io/configmap", "kubernetes.io~configmap"},
	{"ca", "kubernetes.io/configmap", "kubernetes.io~configmap"},
	{"creds", "kubernetes.io/secret", "kubernetes.io~secret"},
	{"info", "kubernetes.io/downward-api", "kubernetes.io~downward-api"},
	{contentAccess, "kubernetes.io/projected", "kubernetes.io~projected"},
}

// onTmpfs reports whether the volume of plugin directory dir is a tmpfs.
func onTmpfs(dir string) bool { return dir != "kubernetes.io~configmap" }

// tokenIssuer answers TokenRequests through the fake clientset: token-1,
// token-2... valid for the expirationSeconds asked; a service account
// named in refuse is refused (Forbidden).
type tokenIssuer struct {
	mu       sync.Mutex
	requests []*authenticationv1.TokenRequest
	refuse   map[string]bool
}

func (ti *tokenIssuer) react(a k8stesting.Action) (bool, runtime.Object, error) {
	if a.GetSubresource() != "token" {
		return false, nil, nil
	}
	create := a.(k8stesting.CreateActionImpl) // a subresource's create names its object
	tr := create.GetObject().(*authenticationv1.TokenRequest).DeepCopy()
	ti.mu.Lock()
	defer ti.mu.Unlock()
	if ti.refuse[create.Name] {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts"}, create.Name,
			errors.New("the node may not request a token of this service account"))
	}
	ti.requests = append(ti.requests, tr.DeepCopy())
	life := time.Hour
	if e := tr.Spec.ExpirationSeconds; e != nil {
		life = time.Duration(*e) * time.Second
	}
	tr.Status = authenticationv1.TokenRequestStatus{Token: fmt.Sprintf("token-%d", len(ti.requests)),
		ExpirationTimestamp: metav1.NewTime(time.Now().Add(life))}
	return true, tr, nil
}

// issued returns the requests answered so far.
func (ti *tokenIssuer) issued() []*authenticationv1.TokenRequest {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	return slices.Clone(ti.requests)
}

// contentObjects creates what the content pods read (the configMaps
// settings and kube-root-ca.crt, the secret db) and the token issuer.
func (e *kindsEnv) contentObjects() *tokenIssuer {
	e.t.Helper()
	ti := &tokenIssuer{refuse: map[string]bool{}}
	e.client.PrependReactor("create", "serviceaccounts", ti.react)
	cms := []*v1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": contentCA}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "settings"}, Data: settingsData("1")},
	}
	for _, cm := range cms {
		if _, err := e.client.CoreV1().ConfigMaps(kindsNS).Create(e.ctx, cm, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "db"},
		Data: map[string][]byte{"user": []byte("admin"), "password": []byte("hunter2")}}
	if _, err := e.client.CoreV1().Secrets(kindsNS).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return ti
}

// settingsData is the configMap settings at version v: app.conf large
// enough (64 KiB) that a torn read would show, its version, a mode key, and
// a key the items leave out.
func settingsData(v string) map[string]string {
	return map[string]string{"app.conf": appConf(v), "version": v, "mode": "strict", "unused": "not projected"}
}

func appConf(v string) string { return strings.Repeat("version "+v+"\n", 64<<10/10) }

// updateConfigMap sets configMap name's data.
func (e *kindsEnv) updateConfigMap(name string, data map[string]string) {
	e.t.Helper()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: name}, Data: data}
	if _, err := e.client.CoreV1().ConfigMaps(kindsNS).Update(e.ctx, cm, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// updateSecret sets secret db's password.
func (e *kindsEnv) updateSecret(password string) {
	e.t.Helper()
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kindsNS, Name: "db"},
		Data: map[string][]byte{"user": []byte("admin"), "password": []byte(password)}}
	if _, err := e.client.CoreV1().Secrets(kindsNS).Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// kubeAPIAccess is the projected volume the API server's ServiceAccount
// admission adds to every pod, exactly (names, paths, modes).
func kubeAPIAccess() v1.Volume {
	return v1.Volume{Name: contentAccess, VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
		DefaultMode: ptrTo[int32](0o644),
		Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptrTo[int64](contentTokenLife)}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		}}}}
}

// contentVolumesOf are the content pod's volumes, as the API server stores
// them (defaults filled in): the configMap settings with items (one nested,
// one of its own mode) and defaultMode 0600 ("conf"), the configMap
// kube-root-ca.crt whole ("ca"), the secret db ("creds"), the pod's labels
// and its container's memory limit ("info"), and the kube-api-access
// volume.
func contentVolumesOf() []v1.Volume {
	return []v1.Volume{
		{Name: "conf", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "settings"}, DefaultMode: ptrTo[int32](0o600),
			Items: []v1.KeyToPath{{Key: "app.conf", Path: "etc/app.conf"}, {Key: "version", Path: "etc/version"},
				{Key: "mode", Path: "mode", Mode: ptrTo[int32](0o400)}}}}},
		{Name: "ca", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}, DefaultMode: ptrTo[int32](0o644)}}},
		{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "db", DefaultMode: ptrTo[int32](0o644)}}},
		{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{DefaultMode: ptrTo[int32](0o644),
			Items: []v1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}},
				{Path: "mem_limit", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: kindsContainer,
					Resource: "limits.memory", Divisor: resource.MustParse("1")}},
			}}}},
		kubeAPIAccess(),
	}
}

// newContentPod is a pod of the node with the content volumes, labels
// app=web and tier=front, the service account default, the fsGroup
// kindsFSGroup and a memory limit of contentMemory.
func newContentPod(name string) *v1.Pod {
	pod := kindsPod(name, contentVolumesOf()...)
	pod.Labels = map[string]string{"app": "web", "tier": "front"}
	pod.Spec.ServiceAccountName = contentSA
	mem := resource.MustParse(contentMemory)
	pod.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Limits: v1.ResourceList{v1.ResourceMemory: mem}, Requests: v1.ResourceList{v1.ResourceMemory: mem}}
	return pod
}

// contentPath is the directory of the pod's content volume name.
func (e *kindsEnv) contentPath(pod *v1.Pod, name string) string {
	for _, k := range contentKinds {
		if k.name == name {
			return e.volumePath(pod, k.dir, name)
		}
	}
	e.t.Fatalf("no content volume %q", name)
	return ""
}

// contentVolumes is what GetMountedVolumesForPod says of a content pod:
// every volume read-only (no container may write to it).
func (e *kindsEnv) contentVolumes(pod *v1.Pod) map[string]wantVolume {
	out := map[string]wantVolume{}
	for _, k := range contentKinds {
		out[k.name] = wantVolume{plugin: k.plugin, path: e.volumePath(pod, k.dir, k.name), dirName: k.name, readOnly: true}
	}
	return out
}

// contentMounts are the pod's tmpfs mounts: its secret, downwardAPI and
// projected volumes, each of the pod's memory limit exactly.
func (e *kindsEnv) contentMounts(pod *v1.Pod) map[string]wantMount {
	out := map[string]wantMount{}
	for _, k := range contentKinds {
		if onTmpfs(k.dir) {
			out[e.volumePath(pod, k.dir, k.name)] = wantMount{fstype: "tmpfs", opt: contentTmpfsSize}
		}
	}
	return out
}

// contentLayout is what the pod has under the root (see checkTree): the
// ready files of the wrapped emptyDirs, the tmpfs mount points (not looked
// into) and the configMap volumes' links and timestamped directories
// (their names read from ..data), with the version prev names if it is
// still there (a write keeps the version it replaced until the next one:
// see atomicwriter's removeOld).
func (e *kindsEnv) contentLayout(pod *v1.Pod, prev map[string]string) []string {
	dir := "pods/" + string(pod.UID)
	var out []string
	for _, k := range contentKinds {
		out = append(out, dir+"/plugins/kubernetes.io~empty-dir/wrapped_"+k.name+"/ready")
		vol := dir + "/volumes/" + k.dir + "/" + k.name
		if onTmpfs(k.dir) {
			out = append(out, vol+"/")
			continue
		}
		out = append(out, vol+"/..data")
		for _, f := range contentTop(k.name) {
			out = append(out, vol+"/"+f)
		}
		versions := []string{e.dataTarget(e.contentPath(pod, k.name))}
		if p := prev[k.name]; p != "" && p != versions[0] && exists(filepath.Join(e.contentPath(pod, k.name), p)) {
			versions = append(versions, p)
		}
		for _, v := range versions {
			out = append(out, vol+"/"+v+"/")
			for _, f := range contentFileList(k.name) {
				out = append(out, vol+"/"+v+"/"+f)
			}
		}
	}
	return out
}

// contentSkeleton is what stays of a content pod once its volumes are
// torn down: the directories of each plugin (see skeleton).
func contentSkeleton(pod *v1.Pod) []string {
	dir := "pods/" + string(pod.UID)
	out := []string{dir + "/plugins/kubernetes.io~empty-dir/"}
	for _, k := range contentKinds {
		out = append(out, dir+"/volumes/"+k.dir+"/")
	}
	return out
}

// contentTop are the user-visible links of volume name, by file name.
func contentTop(name string) []string {
	switch name {
	case "conf":
		return []string{"etc", "mode"}
	case "ca":
		return []string{"ca.crt"}
	case "creds":
		return []string{"password", "user"}
	case "info":
		return []string{"labels", "mem_limit"}
	}
	return []string{"ca.crt", "namespace", "token"}
}

// contentFileList are volume name's files in its timestamped directory,
// directories with a trailing slash.
func contentFileList(name string) []string {
	if name == "conf" {
		return []string{"etc/", "etc/app.conf", "etc/version", "mode"}
	}
	return contentTop(name)
}

// dataTarget is where the volume's ..data link points: its current
// timestamped directory.
func (e *kindsEnv) dataTarget(vol string) string {
	e.t.Helper()
	target, err := os.Readlink(filepath.Join(vol, "..data"))
	if err != nil {
		e.t.Fatal(err)
	}
	return target
}

// wantFile is a file of a content volume: its data and mode (its owner
// is root, its group the pod's fsGroup).
type wantFile struct {
	data string
	mode fs.FileMode
}

// contentFiles is what the volumes show at configMap version v, secret
// password pw, labels and token: the kubelet's modes with an fsGroup
// (group read added; a token 0600 with an fsGroup, so 0640).
func contentFiles(v, pw, labels, token string) map[string]map[string]wantFile {
	return map[string]map[string]wantFile{
		"conf":        {"etc/app.conf": {appConf(v), 0o640}, "etc/version": {v, 0o640}, "mode": {"strict", 0o440}},
		"ca":          {"ca.crt": {contentCA, 0o644}},
		"creds":       {"user": {"admin", 0o644}, "password": {pw, 0o644}},
		"info":        {"labels": {labels, 0o644}, "mem_limit": {contentMemBytes, 0o644}},
		contentAccess: {"token": {token, 0o640}, "ca.crt": {contentCA, 0o644}, "namespace": {kindsNS, 0o644}},
	}
}

const contentLabels = "app=\"web\"\ntier=\"front\""

// checkContent checks each content volume of the pod exactly: the
// volume's directory (mode, group), its entries (..data, one timestamped
// directory, the user-visible links and nothing else), each link (its
// target through ..data, its group), each file read through the
// user-visible path (content, mode, owner root, group fsGroup), and the
// timestamped directory's subdirectories. The version a write replaced
// (v.replaced) may be there beside the current one: no other. It records
// each volume's ..data target in v and returns them.
func (e *kindsEnv) checkContent(label string, pod *v1.Pod, want map[string]map[string]wantFile, v *contentVersions) map[string]string {
	t := e.t
	t.Helper()
	versions := map[string]string{}
	defer v.update(versions)
	for _, k := range contentKinds {
		vol := e.contentPath(pod, k.name)
		at := fmt.Sprintf("%s: volume %q", label, k.name)
		// The wrapped emptyDir's directory with the pod's fsGroup: 0777
		// (a tmpfs root: 01777) with the group's setgid, as the kubelet's
		// emptyDir and ownership change leave it.
		wantRoot := fs.ModeDir | fs.ModeSetgid | 0o777
		if onTmpfs(k.dir) {
			wantRoot |= fs.ModeSticky
		}
		e.checkOwned(at, vol, wantRoot)
		version := e.dataTarget(vol)
		versions[k.name] = version
		if !strings.HasPrefix(version, "..") || strings.Contains(version, "/") {
			t.Errorf("%s: ..data points to %q, want a timestamped directory beside it", at, version)
		}
		e.checkOwned(at, filepath.Join(vol, "..data"), fs.ModeSymlink|0o777)
		e.checkOwned(at, filepath.Join(vol, version), fs.ModeDir|fs.ModeSetgid|0o755)
		entries := []string{"..data", version}
		if p := v.before(k.name, version); p != "" && exists(filepath.Join(vol, p)) {
			entries = append(entries, p)
		}
		for _, top := range contentTop(k.name) {
			entries = append(entries, top)
			link := filepath.Join(vol, top)
			if target, err := os.Readlink(link); err != nil || target != "..data/"+top {
				t.Errorf("%s: %s links to %q (%v), want ..data/%s", at, top, target, err, top)
			}
			e.checkOwned(at, link, fs.ModeSymlink|0o777)
		}
		names, err := os.ReadDir(vol)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range names {
			got = append(got, n.Name())
		}
		if slices.Sort(entries); !slices.Equal(got, entries) {
			t.Errorf("%s: entries %v, want %v", at, got, entries)
		}
		for p, w := range want[k.name] {
			checkFile(t, at, filepath.Join(vol, p), w.data)
			e.checkOwned(at, filepath.Join(vol, version, p), w.mode)
		}
		if k.name == "conf" {
			e.checkOwned(at, filepath.Join(vol, version, "etc"), fs.ModeDir|fs.ModeSetgid|0o755)
		}
	}
	return versions
}

// checkOwned checks path's type and mode (not following a link), and that
// it is root's, of the pod's fsGroup.
func (e *kindsEnv) checkOwned(label, path string, mode fs.FileMode) {
	e.t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		e.t.Errorf("%s: %v", label, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != mode || st.Uid != 0 || st.Gid != kindsFSGroup {
		e.t.Errorf("%s: %s: mode %v, owner %d:%d; want %v, 0:%d", label, rel(e.root, path), fi.Mode(), st.Uid, st.Gid, mode, kindsFSGroup)
	}
}

// contentVersions are the ..data targets of a pod's content volumes: the
// current ones, and for a volume written again the one its last write
// replaced (kept until the next write).
type contentVersions struct{ current, replaced map[string]string }

// before is the version volume name's current one (now) replaced, if any.
func (v *contentVersions) before(name, now string) string {
	if was := v.current[name]; was != "" && was != now {
		return was
	}
	return v.replaced[name]
}

func (v *contentVersions) update(now map[string]string) {
	if v.replaced == nil {
		v.replaced = map[string]string{}
	}
	for name, cur := range now {
		if was := v.current[name]; was != "" && was != cur {
			v.replaced[name] = was
		}
	}
	v.current = now
}
