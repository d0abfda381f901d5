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

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
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
	cm := csitest.Pod("ns", "cm", csitest.PodSpec{Volumes: []csitest.PodVolume{withConfigMap("config", "settings")}})
	sec := csitest.Pod("ns", "sec", csitest.PodSpec{Volumes: []csitest.PodVolume{withSecret("creds", "token")}})
	dw := csitest.Pod("ns", "dw", csitest.PodSpec{Volumes: []csitest.PodVolume{withDownwardLabels("info")}})
	dw.Labels = map[string]string{"app": "web", "tier": "front"}
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
			settled: holds(cm, "kubernetes.io~configmap", "config", "level", "debug\n")},
	}
}

// apiDefaultMode is the defaultMode the API server gives these volumes.
var apiDefaultMode int32 = 0o644

// withConfigMap adds a configMap volume of object name to the pod.
func withConfigMap(vol, name string) csitest.PodVolume {
	return csitest.PodVolume{Name: vol, Source: v1.VolumeSource{
		ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: name}, DefaultMode: &apiDefaultMode}}, ReadOnly: true}
}

// withSecret adds a secret volume of object name to the pod.
func withSecret(vol, name string) csitest.PodVolume {
	return csitest.PodVolume{Name: vol, Source: v1.VolumeSource{
		Secret: &v1.SecretVolumeSource{SecretName: name, DefaultMode: &apiDefaultMode}}, ReadOnly: true}
}

// withDownwardLabels adds a downwardAPI volume with the pod's labels in
// file "labels" and its name in "meta/name".
func withDownwardLabels(vol string) csitest.PodVolume {
	return csitest.PodVolume{Name: vol, Source: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
		DefaultMode: &apiDefaultMode, Items: []v1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "meta/name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
		}}}, ReadOnly: true}
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

// holds tells whether the file key of pod p's volume vol of kind (its
// directory, "kubernetes.io~configmap"), read as a container reads it
// (through its link and ..data), holds want.
func holds(p *v1.Pod, kind, vol, key, want string) func(*crashNode) bool {
	return func(n *crashNode) bool {
		got, err := os.ReadFile(filepath.Join(n.root, "pods", string(p.UID), "volumes", kind, vol, key))
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

// sharedDirs are the directories of the layout that hold many volumes'
// (their containers, which stay when empty, as under the kubelet): that a
// crash made or left one of them is not a leak. Every directory of one
// volume, and every file and symlink, must match exactly.
var sharedDirs = []string{
	"pods", "pods/*", "pods/*/volumes", "pods/*/volumes/kubernetes.io~csi",
	"pods/*/volumes/kubernetes.io~empty-dir", "pods/*/volumes/kubernetes.io~local-volume",
	"pods/*/volumes/kubernetes.io~configmap", "pods/*/volumes/kubernetes.io~secret", "pods/*/volumes/kubernetes.io~downward-api",
	"pods/*/volumes/kubernetes.io~projected",
	"pods/*/plugins", "pods/*/plugins/kubernetes.io~empty-dir",
	"pods/*/volumeDevices", "pods/*/volumeDevices/kubernetes.io~csi",
	"plugins", "plugins/kubernetes.io", "plugins/kubernetes.io/csi", "plugins/kubernetes.io/csi/csitest.nodevol.io",
	"plugins/kubernetes.io/csi/volumeDevices", "plugins/kubernetes.io/csi/volumeDevices/staging",
	"plugins/kubernetes.io/csi/volumeDevices/publish",
	"nodevol", "nodevol/records", "nodevol/records/*",
}

func sharedDir(rel string) bool {
	for _, pattern := range sharedDirs {
		if ok, _ := filepath.Match(pattern, rel); ok {
			return true
		}
	}
	return false
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
	case vm.inspect <- func(l *reconciler.Loop) { l.Resync() }:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
