package volumemanager

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// The crash-point scenarios of the volumes whose files nodevol writes
// from API objects and from the pod (configMap, secret, downwardAPI: a
// wrapped emptyDir, a tmpfs for a secret, with the atomic writer's
// layout), and how crashNode.state sees what they leave: the timestamped
// directories under a normalised name, the files read through ..data with
// their modes and contents, the links' targets, the mounts' types; and
// what the pods' containers read: every file of such a volume once it is
// reported mounted (readObjectFiles), one version of a configMap before
// every step (readers).
//
// A restarted manager resyncs once after its pods are mounted (resyncNow,
// the pods' next sync): the atomic writer keeps the version an update
// replaced until its next Write, so a run whose update was finished by the
// restarted manager keeps the old version one Write longer than a run
// whose restart found it done; the next sync removes it in both.

// objectScenarios are the configMap, secret and downwardAPI scenarios; add
// and del are crashScenarios'.
func objectScenarios(add, del func(*v1.Pod) func(*VolumeManager, *crashNode)) []crashScenario {
	cm := csitest.Pod("ns", "cm", withConfigMap("config", "settings"))
	sec := csitest.Pod("ns", "sec", withSecret("creds", "token"))
	dw := csitest.Pod("ns", "dw", withDownwardLabels("info"), func(p *v1.Pod) {
		p.Labels = map[string]string{"app": "web", "tier": "front"}
	})
	opts := csitest.Options{CreateTargetDirs: true}
	objects := func(string, string) []runtime.Object {
		return []runtime.Object{
			&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"},
				Data: map[string]string{"app.conf": "v1\n", "level": "info\n"}},
			&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "token"},
				Data: map[string][]byte{"token": []byte("s3cr3t\n")}},
		}
	}
	none := func(string, string) []runtime.Object { return nil }
	return []crashScenario{
		{name: "configmap-setup", opts: opts, objects: objects, after: []*v1.Pod{cm}, act: add(cm)},
		{name: "configmap-teardown", opts: opts, objects: objects, before: []*v1.Pod{cm}, other: []*v1.Pod{cm}, act: del(cm)},
		{name: "secret-setup", opts: opts, objects: objects, node: crashNodeObject(), after: []*v1.Pod{sec}, act: add(sec)},
		{name: "secret-teardown", opts: opts, objects: objects, node: crashNodeObject(),
			before: []*v1.Pod{sec}, other: []*v1.Pod{sec}, act: del(sec)},
		{name: "downwardapi-setup", opts: opts, objects: none, after: []*v1.Pod{dw}, act: add(dw)},
		// The other choice: the pod deleted while the agent was down,
		// its half-updated volume torn down.
		{name: "configmap-update", opts: opts, objects: objects, before: []*v1.Pod{cm}, after: []*v1.Pod{cm},
			act:     updateConfigMap("settings", map[string]string{"app.conf": "v2\n", "level": "debug\n"}),
			settled: holds(cm, "config", "level", "debug\n")},
	}
}

// apiDefaultMode is the defaultMode the API server gives these volumes.
var apiDefaultMode int32 = 0o644

// withConfigMap adds a configMap volume of object name to the pod.
func withConfigMap(vol, name string) csitest.PodOption {
	return csitest.WithVolume(v1.Volume{Name: vol, VolumeSource: v1.VolumeSource{
		ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: name}, DefaultMode: &apiDefaultMode}}}, true)
}

// withSecret adds a secret volume of object name to the pod.
func withSecret(vol, name string) csitest.PodOption {
	return csitest.WithVolume(v1.Volume{Name: vol, VolumeSource: v1.VolumeSource{
		Secret: &v1.SecretVolumeSource{SecretName: name, DefaultMode: &apiDefaultMode}}}, true)
}

// withDownwardLabels adds a downwardAPI volume with the pod's labels in
// file "labels" and its name in "meta/name".
func withDownwardLabels(vol string) csitest.PodOption {
	return csitest.WithVolume(v1.Volume{Name: vol, VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
		DefaultMode: &apiDefaultMode, Items: []v1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "meta/name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
		}}}}, true)
}

// updateConfigMap sets keys of configMap name in the API server.
func updateConfigMap(name string, keys map[string]string) func(*VolumeManager, *crashNode) {
	return func(_ *VolumeManager, n *crashNode) {
		ctx := context.Background()
		cm, err := n.client.CoreV1().ConfigMaps("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			n.t.Error(err)
			return
		}
		maps.Copy(cm.Data, keys)
		n.readers.add(cm)
		if _, err := n.client.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			n.t.Error(err)
		}
	}
}

// holds tells whether the file key of pod p's configMap volume vol, read
// as a container reads it (through its link and ..data), holds want.
func holds(p *v1.Pod, vol, key, want string) func(*crashNode) bool {
	return func(n *crashNode) bool {
		got, err := os.ReadFile(filepath.Join(n.root, "pods", string(p.UID), "volumes", "kubernetes.io~configmap", vol, key))
		return err == nil && string(got) == want
	}
}

// versionName is a timestamped directory's name: the atomic writer's (and
// the kubelet's), different in every run.
var versionName = regexp.MustCompile(`^\.\.\d{4}_\d{2}_\d{2}_\d{2}_\d{2}_\d{2}\.\d+$`)

// normalise replaces the timestamped directories' names in rel by "..TS".
func normalise(rel string) string {
	parts := strings.Split(rel, "/")
	for i, p := range parts {
		if versionName.MatchString(p) {
			parts[i] = "..TS"
		}
	}
	return strings.Join(parts, "/")
}

// treeEntries are the entries of state's tree for path: its kind and
// path, normalised; a link's target; a file's mode and content when it is
// in a timestamped directory; and, for a ..data link, every file read
// through it, which tells which version is the visible one. None for a
// directory of the shared layout.
func (n *crashNode) treeEntries(path string, d fs.DirEntry) []string {
	rel := n.rel(path)
	switch {
	case d.Type()&fs.ModeSymlink != 0:
		target, _ := os.Readlink(path)
		if filepath.IsAbs(target) {
			target = n.rel(target) // a block volume's links, into the run's root
		}
		out := []string{"l " + normalise(rel) + " -> " + normalise(target)}
		if d.Name() == "..data" {
			out = append(out, n.filesThrough(path)...)
		}
		return out
	case d.IsDir() && sharedDir(rel):
		return nil
	case d.IsDir():
		return []string{"d " + normalise(rel)}
	case normalise(rel) != rel:
		return []string{"f " + normalise(rel) + " " + fileContent(path)}
	}
	return []string{"f " + rel}
}

// filesThrough lists the files a reader finds through link ..data, with
// their modes and contents.
func (n *crashNode) filesThrough(link string) []string {
	var out []string
	_ = filepath.WalkDir(link+"/", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		sub, _ := filepath.Rel(link, path)
		out = append(out, "c "+normalise(n.rel(link))+"/"+sub+" "+fileContent(path))
		return nil
	})
	return out
}

// fileContent is a file's mode and content, quoted.
func fileContent(path string) string {
	fi, err := os.Lstat(path)
	if err != nil {
		return err.Error()
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%v %q", fi.Mode(), data)
}

// resyncNow makes the manager resync at once, as at its periodic tick:
// the pods' next sync, which publishes their configMap, secret and
// downwardAPI volumes again.
func resyncNow(ctx context.Context, vm *VolumeManager) error {
	select {
	case vm.inspect <- func(l *loop) { l.resync() }:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readObjectFiles reads, as pod p's container does when it starts, every
// file of its configMap, secret and downwardAPI volumes (the keys of the
// object in the API server, the downwardAPI items): a volume reported
// mounted must hold them all, whatever version.
func (n *crashNode) readObjectFiles(ctx context.Context, vm *VolumeManager, p *v1.Pod) error {
	for _, mv := range vm.GetMountedVolumesForPod(p.UID) {
		var names []string
		src := specVolume(p, mv.SpecName)
		switch {
		case src.ConfigMap != nil:
			cm, err := n.client.CoreV1().ConfigMaps(p.Namespace).Get(ctx, src.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for k := range cm.Data {
				names = append(names, k)
			}
		case src.Secret != nil:
			sec, err := n.client.CoreV1().Secrets(p.Namespace).Get(ctx, src.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for k := range sec.Data {
				names = append(names, k)
			}
		case src.DownwardAPI != nil:
			for _, item := range src.DownwardAPI.Items {
				names = append(names, item.Path)
			}
		}
		for _, name := range names {
			if _, err := os.ReadFile(filepath.Join(mv.Path, name)); err != nil {
				return fmt.Errorf("pod %s: its container found volume %q mounted without its file %q: %w", p.Name, mv.SpecName, name, err)
			}
		}
	}
	return nil
}

// forgetTmpfs empties the directories of the fake mounter's tmpfs mounts
// (a Memory emptyDir's, a secret volume's): their content is in memory,
// and a reboot takes it; the directory itself is on the disk, and stays.
func (n *crashNode) forgetTmpfs() {
	mps, _ := n.mounter.List()
	for _, mp := range mps {
		if mp.Type != "tmpfs" {
			continue
		}
		entries, _ := os.ReadDir(mp.Path)
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(mp.Path, e.Name())); err != nil {
				n.t.Fatal(err)
			}
		}
	}
}

// readers are the containers reading their configMap volumes: before
// every step of every run (crashNode.checkStep), each configMap volume's
// files, read through their links, must be one version of the object,
// every name the same one (the atomic writer's switch is one rename): a
// mix of two versions is a violation. A name not there yet is not one:
// the links of new names follow the switch, as in the kubelet.
type readers struct {
	mu sync.Mutex
	// versions are every configMap's contents the API server has had.
	versions []map[string]string
}

// add records the contents of the configMaps among objs.
func (r *readers) add(objs ...runtime.Object) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range objs {
		if cm, ok := o.(*v1.ConfigMap); ok {
			r.versions = append(r.versions, maps.Clone(cm.Data))
		}
	}
}

// check reads every configMap volume on the node and records a mix as a
// violation.
func (r *readers) check(n *crashNode) {
	dirs, _ := filepath.Glob(filepath.Join(n.root, "pods", "*", "volumes", "kubernetes.io~configmap", "*"))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, dir := range dirs {
		seen := map[string]string{}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if data, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && !strings.HasPrefix(e.Name(), "..") {
				seen[e.Name()] = string(data)
			}
		}
		if !r.oneVersion(seen) {
			n.mu.Lock()
			n.violations = append(n.violations, fmt.Sprintf("a reader of %s saw a mix of versions: %v", n.rel(dir), seen))
			n.mu.Unlock()
		}
	}
}

// oneVersion reports whether every file in seen is of one version.
func (r *readers) oneVersion(seen map[string]string) bool {
	for _, v := range r.versions {
		same := true
		for name, data := range seen {
			if got, ok := v[name]; !ok || got != data {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}
