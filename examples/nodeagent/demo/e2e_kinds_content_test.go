package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
)

// checkTokenRequests checks that the pod's token was requested once, as
// the kubelet requests the kube-api-access volume's: for the pod's service
// account, no audience (the API server's), expirationSeconds 3607, bound
// to the pod.
func checkTokenRequests(t *testing.T, got []*authenticationv1.TokenRequest, pod *v1.Pod) {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("%d token requests, want 1", len(got))
	}
	s := got[0].Spec
	b := s.BoundObjectRef
	if len(s.Audiences) != 0 || s.ExpirationSeconds == nil || *s.ExpirationSeconds != contentTokenLife ||
		b == nil || b.APIVersion != "v1" || b.Kind != "Pod" || b.Name != pod.Name || b.UID != pod.UID {
		t.Errorf("token request %+v (bound to %+v); want no audience, expirationSeconds %d, bound to pod %s (%s)", s, b, contentTokenLife, pod.Name, pod.UID)
	}
}

// reader reads one of a volume's values through its user-visible path
// until stopped, and records each value it saw that differs from the one
// before, and each read that failed or showed a mix.
type reader struct {
	read func() (string, error)
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	seen  []string
	fails []string
	reads int
}

// startReader reads once before it returns, so the value before a change
// the caller makes next is seen however late the goroutine is scheduled,
// then goes on reading in a goroutine until finish.
func startReader(read func() (string, error)) *reader {
	r := &reader{read: read, stop: make(chan struct{}), done: make(chan struct{})}
	r.once()
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			r.once()
		}
	}()
	return r
}

func (r *reader) once() {
	v, err := r.read()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	switch {
	case err != nil:
		r.fails = append(r.fails, err.Error())
	case len(r.seen) == 0 || r.seen[len(r.seen)-1] != v:
		r.seen = append(r.seen, v)
	}
}

// finish stops the reader, reads once more (after the update is in) and
// checks that it saw exactly want, in order, and no failed read.
func (r *reader) finish(t *testing.T, label string, want ...string) {
	t.Helper()
	close(r.stop)
	<-r.done
	r.once()
	if len(r.fails) > 0 {
		t.Errorf("%s: %d of %d reads failed or saw a mix, the first: %s", label, len(r.fails), r.reads, r.fails[0])
	}
	if !slices.Equal(r.seen, want) {
		t.Errorf("%s: a reader saw %q in %d reads, want %q", label, r.seen, r.reads, want)
	}
	t.Logf("%s: %d reads", label, r.reads)
}

// readSettings reads the conf volume's etc/version and etc/app.conf from
// one lookup of its user-visible directory etc: the version, or an error
// if app.conf is of another version (a mix) or torn.
func readSettings(vol string) func() (string, error) {
	return func() (string, error) {
		root, err := os.OpenRoot(filepath.Join(vol, "etc"))
		if err != nil {
			return "", err
		}
		defer root.Close()
		v, err := root.ReadFile("version")
		if err != nil {
			return "", err
		}
		conf, err := root.ReadFile("app.conf")
		if err != nil {
			return "", err
		}
		if string(conf) != appConf(string(v)) {
			return "", fmt.Errorf("version %q beside an app.conf of %d bytes that is not its own", v, len(conf))
		}
		return string(v), nil
	}
}

// readFile reads path.
func readFile(path string) func() (string, error) {
	return func() (string, error) {
		data, err := os.ReadFile(path)
		return string(data), err
	}
}

// waitContent waits until the file of the pod's content volume holds data.
func (e *kindsEnv) waitContent(pod *v1.Pod, volume, file, data string) {
	e.t.Helper()
	path := filepath.Join(e.contentPath(pod, volume), file)
	waitFor(e.t, fmt.Sprintf("%s to be %q", rel(e.root, path), data), time.Minute, func() bool {
		got, err := os.ReadFile(path)
		return err == nil && string(got) == data
	})
}

// checkRewritten checks that, of the volumes whose ..data targets were
// before, exactly those named in changed point to a new version now.
func (e *kindsEnv) checkRewritten(label string, before, now map[string]string, changed ...string) {
	e.t.Helper()
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if got := now[name] != before[name]; got != slices.Contains(changed, name) {
			e.t.Errorf("%s: volume %q: ..data %s, was %s: rewritten %v, want %v", label, name, now[name], before[name], got, !got)
		}
	}
}

// TestAllKindsContentUpdates mounts the content pod and changes what its
// volumes show, through the fake API server and the pod: a configMap
// update reaches the conf volume's files (through the object cache's
// watch: the resync is a minute away), a reader of the user-visible path
// seeing the old version then the new, never a mix; a secret update
// reaches the secret's tmpfs; a new label of the pod (UpdatePod) rewrites
// the downwardAPI labels file. Each change rewrites only the volume that
// shows it, on the same tmpfs mounts, with the same modes and owners; the
// token is requested once. Deleting the pod unmounts the tmpfs mounts and
// removes the volumes' directories and ready files.
func TestAllKindsContentUpdates(t *testing.T) {
	e := newKindsEnv(t, "nv-kindc-")
	tokens := e.contentObjects()
	vm, _, _ := e.start()
	pod := newContentPod("content")
	e.mountAll(vm, pod)
	mounts := e.checkMounts("mounted", e.contentMounts(pod))
	var seen contentVersions
	v1s := e.checkContent("mounted", pod, contentFiles("1", "hunter2", contentLabels, "token-1"), &seen)

	conf := startReader(readSettings(e.contentPath(pod, "conf")))
	creds := startReader(readFile(filepath.Join(e.contentPath(pod, "creds"), "password")))
	e.updateConfigMap("settings", settingsData("2"))
	e.waitContent(pod, "conf", "etc/version", "2")
	conf.finish(t, "configMap update", "1", "2")
	v2s := e.checkContent("configMap updated", pod, contentFiles("2", "hunter2", contentLabels, "token-1"), &seen)
	e.checkRewritten("configMap updated", v1s, v2s, "conf")

	e.updateSecret("correct horse")
	e.waitContent(pod, "creds", "password", "correct horse")
	creds.finish(t, "secret update", "hunter2", "correct horse")
	v3s := e.checkContent("secret updated", pod, contentFiles("2", "correct horse", contentLabels, "token-1"), &seen)
	e.checkRewritten("secret updated", v2s, v3s, "creds")

	relabelled := pod.DeepCopy()
	relabelled.Labels["tier"] = "back"
	if err := vm.UpdatePod(relabelled); err != nil {
		t.Fatal(err)
	}
	labels := "app=\"web\"\ntier=\"back\""
	e.waitContent(pod, "info", "labels", labels)
	v4s := e.checkContent("pod relabelled", pod, contentFiles("2", "correct horse", labels, "token-1"), &seen)
	e.checkRewritten("pod relabelled", v3s, v4s, "info")
	e.checkSameMounts("after the updates", mounts, e.contentMounts(pod))
	e.checkTree("after the updates", e.contentLayout(pod, seen.replaced))
	checkTokenRequests(t, tokens.issued(), pod)

	deletePods(t, e.ctx, vm, []*v1.Pod{relabelled})
	e.checkMounts("deleted", nil)
	e.checkTree("deleted", contentSkeleton(pod))
}
