package flexvolume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/mount-utils"
	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// recorder is an exec.Interface that records each driver call and answers
// it with replies[command] (a Success reply when none is set).
type recorder struct {
	mu      sync.Mutex
	calls   [][]string
	replies map[string]string
	// fail, if set, is the exec error of a command (with its reply).
	fail map[string]error
}

var _ exec.Interface = (*recorder)(nil)

func (r *recorder) Command(cmd string, args ...string) exec.Cmd {
	return r.CommandContext(context.Background(), cmd, args...)
}

func (r *recorder) CommandContext(_ context.Context, cmd string, args ...string) exec.Cmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, append([]string{cmd}, args...))
	out, ok := r.replies[args[0]]
	if !ok {
		out = `{"status": "Success"}`
	}
	err := r.fail[args[0]]
	return &testingexec.FakeCmd{
		Argv:                 append([]string{cmd}, args...),
		CombinedOutputScript: []testingexec.FakeAction{func() ([]byte, []byte, error) { return []byte(out), nil, err }},
	}
}

func (r *recorder) LookPath(file string) (string, error) { return "", errors.New("no lookups") }

// commands returns the commands called, in order.
func (r *recorder) commands() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		out = append(out, c[1])
	}
	return out
}

// last returns the last call of command (nil if none).
func (r *recorder) last(command string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.calls) - 1; i >= 0; i-- {
		if r.calls[i][1] == command {
			return r.calls[i]
		}
	}
	return nil
}

// options decodes the JSON options of a call (its last argument, or arg i).
func options(t *testing.T, call []string, i int) map[string]string {
	t.Helper()
	var o map[string]string
	if err := json.Unmarshal([]byte(call[i]), &o); err != nil {
		t.Fatalf("options of %v: %v", call, err)
	}
	return o
}

// fakeSecrets answers from a map of "namespace/name".
type fakeSecrets map[string]*v1.Secret

func (f fakeSecrets) Secret(_ context.Context, ns, name string) (*v1.Secret, error) {
	if s, ok := f[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("secrets"), name)
}

// testDriver is a driver of name with caps on a root in t.TempDir, run
// through rec, with a fake mounter.
func testDriver(t *testing.T, name string, caps capabilities, rec *recorder, secrets Secrets) (*driver, *mount.FakeMounter) {
	t.Helper()
	root := t.TempDir()
	rfs, err := rootfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	fm := mount.NewFakeMounter(nil)
	h := &host{root: rfs.Path(), rfs: rfs, mounter: fm, formatter: mount.NewSafeFormatAndMount(fm, rec), exec: rec,
		secrets: secrets, nodeName: "node-1", waitTimeout: 10e9}
	last := name[strings.LastIndex(name, "/")+1:]
	return &driver{host: h, name: name, dirName: escape(name), exe: fmt.Sprintf("/plugins/%s/%s", escape(name), last),
		caps: caps, unsupported: map[string]bool{}}, fm
}
