package volumemanager

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
)

// bindDriver is a flexVolume driver in sh that bind-mounts the directory
// of its "source" option at the pod's directory with the real mount
// command, and says so in {log}; its init says attach false. failMount,
// if set, is the message of a mount that fails.
func bindDriver(log, failMount string) string {
	mountCase := `src=$(printf '%s' "$3" | sed -n 's/.*"source":"\([^"]*\)".*/\1/p')
  if mount --bind "$src" "$2"; then echo '{"status":"Success"}'; else echo '{"status":"Failure","message":"bind mount failed"}'; fi`
	if failMount != "" {
		mountCase = `echo '{"status":"Failure","message":"` + failMount + `"}'`
	}
	return `#!/bin/sh
echo "$1 $2" >> ` + log + `
case "$1" in
init) echo '{"status":"Success","capabilities":{"attach":false}}';;
mount) ` + mountCase + `;;
unmount) if umount "$2"; then echo '{"status":"Success"}'; else echo '{"status":"Failure","message":"umount failed"}'; fi;;
*) echo '{"status":"Not supported"}';;
esac
`
}

// installDriver writes script as driver name's executable in dir, through
// a hidden temporary name, as an installer would (atomically).
func installDriver(t *testing.T, dir, name, script string) {
	t.Helper()
	d := filepath.Join(dir, strings.ReplaceAll(name, "/", "~"))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(d, ".installing")
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d, name[strings.LastIndex(name, "/")+1:])); err != nil {
		t.Fatal(err)
	}
}

func flexPod(name, driver, source string) *v1.Pod {
	return csitest.Pod("ns", name, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Source: v1.VolumeSource{FlexVolume: &v1.FlexVolumeSource{
		Driver: driver, Options: map[string]string{"source": source}}}}}})
}

// mountsUnder returns the mount points under dir in this process's mount
// table.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestFlexVolumeRealDriver mounts a pod's flexVolume through a driver
// script that bind-mounts on real mounts: the file the source holds is
// seen through the pod's directory (as a container sees it), a file
// written there lands in the source, and teardown leaves no mount and no
// directory. A second driver, installed while the manager runs, is probed
// and mounts a pod that waited for it.
func TestFlexVolumeRealDriver(t *testing.T) {
	roottest.Require(t)
	plugins, src, logDir := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("world"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(logDir, "calls")
	installDriver(t, plugins, "nodevol.io/bind", bindDriver(log, ""))
	e := newEnv(t, envOptions{mounter: mount.New(""), volumePluginDir: plugins})
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, e.root) { // a failed test leaves nothing mounted
			_ = mount.New("").Unmount(m)
		}
	})
	pod := flexPod("p", "nodevol.io/bind", src)
	if err := e.mount(pod, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "nodevol.io~bind", "data")
	mounted := e.vm.GetMountedVolumesForPod(pod.UID)
	if len(mounted) != 1 || mounted[0].Path != dir || mounted[0].Plugin != "nodevol.io/bind" {
		t.Fatalf("mounted = %+v, want data at %s", mounted, dir)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "hello")); err != nil || string(b) != "world" {
		t.Errorf("reading the source's file through the pod's directory: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "written"), []byte("by the pod"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(src, "written")); err != nil || string(b) != "by the pod" {
		t.Errorf("the pod's write in the source: %q, %v", b, err)
	}
	if got := mountsUnder(t, e.root); len(got) != 1 || got[0] != dir {
		t.Errorf("mount table under the root = %q, want only %s", got, dir)
	}
	e.unmount(pod)
	if got := mountsUnder(t, e.root); len(got) != 0 {
		t.Errorf("mount table under the root after teardown = %q, want nothing", got)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's volume directory after teardown: %v, want it removed", err)
	}
	calls, _ := os.ReadFile(log)
	if want := "init \nmount " + dir + "\nunmount " + dir + "\n"; string(calls) != want {
		t.Errorf("driver calls:\n%s\nwant:\n%s", calls, want)
	}

	// A driver installed while running.
	late := flexPod("late", "nodevol.io/late", src)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e.vm.AddPod(late)
	eventually(t, "the pod's volume unresolved while its driver is missing", func() bool {
		return slices.ContainsFunc(e.vm.dsw.PodsWithErrors(), func(p podvol.PodRef) bool { return p.UID == late.UID })
	})
	// Not final, as in the kubelet: its driver may come (a wait whose
	// context has ended still returns at once for a final error).
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := e.vm.WaitForAttachAndMount(done, late); err == nil || errors.Is(err, ErrFinal) || !strings.Contains(err.Error(), `flexVolume driver "nodevol.io/late" not found`) {
		t.Errorf("waiting for a volume of a driver not installed = %v, want an error, not final, naming the driver", err)
	}
	installDriver(t, plugins, "nodevol.io/late", bindDriver(filepath.Join(logDir, "late"), ""))
	if err := e.vm.WaitForAttachAndMount(ctx, late); err != nil {
		t.Fatalf("after the driver was installed: %v", err)
	}
	lateDir := filepath.Join(e.root, "pods", string(late.UID), "volumes", "nodevol.io~late", "data")
	if b, err := os.ReadFile(filepath.Join(lateDir, "hello")); err != nil || string(b) != "world" {
		t.Errorf("reading through the late driver's mount: %q, %v", b, err)
	}
	e.unmount(late)
	if got := mountsUnder(t, e.root); len(got) != 0 {
		t.Errorf("mount table under the root after teardown = %q, want nothing", got)
	}
}

// TestFlexVolumeDriverFailure: a driver's failed mount is the pod's wait
// error, naming the pod, the volume, the driver and the driver's message.
func TestFlexVolumeDriverFailure(t *testing.T) {
	plugins := t.TempDir()
	installDriver(t, plugins, "nodevol.io/broken", bindDriver(filepath.Join(t.TempDir(), "calls"), "no such share on server"))
	e := newEnv(t, envOptions{volumePluginDir: plugins})
	pod := flexPod("p", "nodevol.io/broken", "/nowhere")
	err := e.mount(pod, 2*time.Second)
	for _, want := range []string{"ns/p", `"data"`, "nodevol.io/broken", "mount command failed, status: Failure, reason: no such share on server"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("wait error = %v, want it to say %q", err, want)
		}
	}
}

// TestFlexVolumeAttachWithController: a driver whose init says attach
// (the kubelet's default) has its inline volume named node-scoped, as the
// kubelet names it; the node waits for the attach/detach controller to
// list it in the Node's status.volumesAttached, then calls waitforattach
// with the listed device, mountdevice and mount, the secret of the
// volume's secretRef among mount's options (read through the object
// cache); the way back is unmount and unmountdevice.
func TestFlexVolumeAttachWithController(t *testing.T) {
	plugins, logDir := t.TempDir(), t.TempDir()
	log := filepath.Join(logDir, "calls")
	secretOpt := `"kubernetes.io/secret/key":"` + base64.StdEncoding.EncodeToString([]byte("value")) + `"`
	installDriver(t, plugins, "nodevol.io/disk", `#!/bin/sh
case "$3$4" in *'`+secretOpt+`'*) s=secret;; *) s=-;; esac
echo "$1 $2 $s" >> `+log+`
case "$1" in
init) echo '{"status":"Success"}';;
waitforattach) echo '{"status":"Success","device":"/dev/flex-disk"}';;
mountdevice|mount|unmount|unmountdevice) echo '{"status":"Success"}';;
*) echo '{"status":"Not supported"}';;
esac
`)
	nodeObj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "disk-creds"}, Type: "nodevol.io/disk", Data: map[string][]byte{"key": []byte("value")}}
	e := newEnv(t, envOptions{volumePluginDir: plugins, objects: []runtime.Object{nodeObj, sec}})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Source: v1.VolumeSource{FlexVolume: &v1.FlexVolumeSource{
		Driver: "nodevol.io/disk", SecretRef: &v1.LocalObjectReference{Name: "disk-creds"}}}}}})
	e.vm.AddPod(pod)
	eventually(t, "the volume waiting for the attach/detach controller", func() bool {
		_, ok := e.vm.dsw.Spec("nodevol.io/disk/data")
		return ok
	})
	if calls, _ := os.ReadFile(log); strings.Contains(string(calls), "waitforattach") {
		t.Fatalf("waitforattach before the Node listed the volume:\n%s", calls)
	}
	nodeObj.Status.VolumesAttached = []v1.AttachedVolume{{Name: "nodevol.io/disk/data", DevicePath: "/dev/listed"}}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(context.Background(), nodeObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	dmp := filepath.Join(e.root, "plugins/kubernetes.io/flexvolume/nodevol.io/disk/mounts/data")
	dir := filepath.Join(e.root, "pods", string(pod.UID), "volumes/nodevol.io~disk/data")
	if n := e.vm.GetVolumesInUse(); !slices.Contains(n, "nodevol.io/disk/data") {
		t.Errorf("volumes in use = %v, want the attached flexVolume by the kubelet's name", n)
	}
	e.unmount(pod)
	want := "init  -\nwaitforattach /dev/listed -\ngetvolumename {\"kubernetes.io/fsType\":\"\",\"kubernetes.io/pvOrVolumeName\":\"data\",\"kubernetes.io/readwrite\":\"rw\"} -\n" +
		"mountdevice " + dmp + " -\nmount " + dir + " secret\nunmount " + dir + " -\n"
	if calls, _ := os.ReadFile(log); string(calls) != want {
		t.Errorf("driver calls:\n%s\nwant:\n%s", calls, want)
	}
}
