package volumemanager

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// What the pods' containers see of the volumes whose files nodevol writes,
// in the crash-point suite: the files a container reads when it starts
// (readObjectFiles), and what it reads before every step of every run
// (readers).

// readObjectFiles reads, as pod p's container does when it starts, every
// file of its configMap, secret, downwardAPI and projected volumes (the
// keys of the objects in the API server, the items, the token's path): a
// volume reported mounted must hold them all, whatever version. From then
// on the pod runs: its files must stay readable before every step
// (readers) until it is deleted or the node reboots.
func (n *crashNode) readObjectFiles(ctx context.Context, vm *VolumeManager, p *v1.Pod) error {
	for _, mv := range vm.GetMountedVolumesForPod(p.UID) {
		var names []string
		var err error
		src := specVolume(p, mv.SpecName)
		switch {
		case src.ConfigMap != nil:
			names, err = n.objectKeys(ctx, p.Namespace, src.ConfigMap.Name, true, src.ConfigMap.Items)
		case src.Secret != nil:
			names, err = n.objectKeys(ctx, p.Namespace, src.Secret.SecretName, false, src.Secret.Items)
		case src.DownwardAPI != nil:
			names = itemPaths(src.DownwardAPI.Items)
		case src.Projected != nil:
			names, err = n.projectedNames(ctx, p, src.Projected)
		default:
			continue
		}
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, err := os.ReadFile(filepath.Join(mv.Path, name)); err != nil {
				return fmt.Errorf("pod %s: its container found volume %q mounted without its file %q: %w", p.Name, mv.SpecName, name, err)
			}
		}
		n.readers.run(p.UID, mv.Path, names)
	}
	return nil
}

// itemPaths are the paths of downward API items.
func itemPaths(items []v1.DownwardAPIVolumeFile) []string {
	var out []string
	for _, item := range items {
		out = append(out, item.Path)
	}
	return out
}

// objectKeys are the file names of configMap (or secret) name in the
// API server: its keys, or the paths of items.
func (n *crashNode) objectKeys(ctx context.Context, ns, name string, configMap bool, items []v1.KeyToPath) ([]string, error) {
	if len(items) > 0 {
		var names []string
		for _, it := range items {
			names = append(names, it.Path)
		}
		return names, nil
	}
	if configMap {
		cm, err := n.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return slices.Collect(maps.Keys(cm.Data)), nil
	}
	sec, err := n.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return slices.Collect(maps.Keys(sec.Data)), nil
}

// readers are the pods' containers reading their volumes: before every
// step of every run (crashNode.checkStep), each configMap and projected
// volume's files, read through their links, must be one version of what
// the volume shows, every name the same one (the atomic writer's switch is
// one rename): a mix of two versions is a violation. A name not there yet
// is not one: the links of new names follow the switch, as in the
// kubelet. And every file of a running pod's volumes (readObjectFiles)
// must be there: missing is a violation.
type readers struct {
	mu sync.Mutex
	// versions are every content a volume may show: every configMap's
	// contents the API server has had, and what project makes of them.
	versions []map[string]string
	// project, if set, is what a projected volume shows of a configMap's
	// contents (nil: nothing).
	project func(cm *v1.ConfigMap) map[string]string
	// running are the running pods' volumes: each one's directory and
	// the names of its files.
	running map[types.UID]map[string][]string
}

// add records the contents of the configMaps among objs.
func (r *readers) add(objs ...runtime.Object) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range objs {
		cm, ok := o.(*v1.ConfigMap)
		if !ok {
			continue
		}
		r.versions = append(r.versions, maps.Clone(cm.Data))
		if r.project == nil {
			continue
		}
		if v := r.project(cm); v != nil {
			r.versions = append(r.versions, v)
		}
	}
}

// run records that pod uid runs with the files names in its volume dir.
func (r *readers) run(uid types.UID, dir string, names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[types.UID]map[string][]string{}
	}
	if r.running[uid] == nil {
		r.running[uid] = map[string][]string{}
	}
	r.running[uid][dir] = slices.Clone(names)
}

// stop records that the pods' containers stopped (the pods deleted).
func (r *readers) stop(pods ...*v1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range pods {
		delete(r.running, p.UID)
	}
}

// stopAll records that every container stopped (a reboot).
func (r *readers) stopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.running)
}

// check reads every configMap and projected volume on the node, and every
// running pod's files, and records a mix or a missing file as a violation.
func (r *readers) check(n *crashNode) {
	var dirs []string
	for _, kind := range []string{"kubernetes.io~configmap", "kubernetes.io~projected"} {
		found, _ := filepath.Glob(filepath.Join(n.root, "pods", "*", "volumes", kind, "*"))
		dirs = append(dirs, found...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var violations []string
	for _, dir := range dirs {
		seen := map[string]string{}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if data, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && !strings.HasPrefix(e.Name(), "..") {
				seen[e.Name()] = string(data)
			}
		}
		if !r.oneVersion(seen) {
			violations = append(violations, fmt.Sprintf("a reader of %s saw a mix of versions: %v", n.rel(dir), seen))
		}
	}
	for uid, vols := range r.running {
		for dir, names := range vols {
			for _, name := range names {
				if _, err := os.ReadFile(filepath.Join(dir, name)); err != nil {
					violations = append(violations, fmt.Sprintf("running pod %s: its container could not read %s: %v", uid, n.rel(filepath.Join(dir, name)), err))
				}
			}
		}
	}
	n.mu.Lock()
	n.violations = append(n.violations, violations...)
	n.mu.Unlock()
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

// mountEntries are the mount table's entries for state: each mount's path
// and type, with the number of times it is mounted when more than once (a
// tmpfs mounted again over itself hides the files under it).
func (n *crashNode) mountEntries() []string {
	mps, _ := n.mounter.List()
	count := map[string]int{}
	for _, mp := range mps {
		count[n.rel(mp.Path)+" "+mp.Type]++
	}
	var out []string
	for e, c := range count {
		if c > 1 {
			e = fmt.Sprintf("%s (mounted %d times)", e, c)
		}
		out = append(out, e)
	}
	return out
}
