package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/roottest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestRuntimeRunsContainers starts containerd, runs a hostNetwork pod
// sandbox (with the runtime handler test-handler) with a busybox container that writes into a directory of the
// host bind-mounted into it, and checks on Stop that nothing is left: no
// process naming the runtime's directory, no mount below it, the
// directory gone.
func TestRuntimeRunsContainers(t *testing.T) {
	dir, err := os.MkdirTemp("", "rn-")
	if err != nil {
		t.Fatal(err)
	}
	r := StartT(t, Options{Dir: dir})
	ctx := t.Context()
	host := t.TempDir()
	cri := r.CRI()
	meta := &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "realnode", Uid: "uid-1"}
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: meta, LogDirectory: t.TempDir(),
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}}
	// The RuntimeClass specs' handler, which is runc as the default is.
	sb, err := cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg, RuntimeHandler: "test-handler"})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v (containerd's log: %s)", err, r.Log())
	}
	if out := runContainer(t, r, sb.PodSandboxId, sbCfg, "echo hello from $(id -u) > /out/file && ls /bin/sh",
		&runtimeapi.Mount{ContainerPath: "/out", HostPath: host}); out != "/bin/sh" {
		t.Errorf("the container printed %q, want /bin/sh", out)
	}
	if got, err := os.ReadFile(filepath.Join(host, "file")); err != nil || string(got) != "hello from 0\n" {
		t.Errorf("the container wrote %q, %v; want %q", got, err, "hello from 0\n")
	}
	if sbs, err := r.Sandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes: %v, %v; want the one", sbs, err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := ProcessesNaming(dir); len(pids) > 0 {
		t.Errorf("processes left naming %s: %v", dir, pids)
	}
	if ms, err := MountsUnder(dir); err != nil || len(ms) > 0 {
		t.Errorf("mounts left below %s: %v, %v", dir, ms, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
}

// TestWriteArchive checks an image archive's layout: the index names the
// image, the layer holds each file with its mode and parents, and the
// same image gives the same bytes.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	img := Image{Name: "example.com/x/y:1.2", Cmd: []string{"sh"}, Files: []File{
		{Path: "/bin/tool", Content: []byte("#!x"), Mode: 0o755},
		{Path: "/bin/sh", Link: "tool"},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/etc/deep/file", Content: []byte("x")},
	}}
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	for _, p := range []string{a, b} {
		if err := WriteArchive(img, p); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Error("the same image gave two archives")
	}
	files := untar(t, da)
	if !strings.Contains(string(files["index.json"]), `"io.containerd.image.name":"example.com/x/y:1.2"`) {
		t.Errorf("index.json does not name the image: %s", files["index.json"])
	}
	var layer []byte
	for name, data := range files {
		if strings.HasPrefix(name, "blobs/") && bytes.HasPrefix(data[257:], []byte("ustar")) {
			layer = data
		}
	}
	if layer == nil {
		t.Fatal("no layer in the archive")
	}
	var got []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %c %o %s", h.Name, h.Typeflag, h.Mode, h.Linkname))
	}
	want := []string{"bin/ 5 755 ", "bin/sh 2 777 tool", "bin/tool 0 755 ", "etc/ 5 755 ", "etc/deep/ 5 755 ", "etc/deep/file 0 644 ", "tmp/ 5 1777 "}
	if !slices.Equal(got, want) {
		t.Errorf("layer:\ngot  %q\nwant %q", got, want)
	}
}

func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

// TestWriteArchiveRefusesBadFiles refuses a relative path, a file given
// twice, and a file that is two things.
func TestWriteArchiveRefusesBadFiles(t *testing.T) {
	for name, files := range map[string][]File{
		"relative":  {{Path: "bin/x", Content: []byte("x")}},
		"root":      {{Path: "/", Dir: true}},
		"twice":     {{Path: "/x", Content: []byte("x")}, {Path: "/x", Dir: true}},
		"two kinds": {{Path: "/x", Content: []byte("x"), Link: "y"}},
		"no kind":   {{Path: "/x"}},
	} {
		if err := WriteArchive(Image{Name: "x:1", Files: files}, filepath.Join(t.TempDir(), "x.tar")); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestPodNetworkInNetNS starts containerd in a network namespace made for
// the node, with a pod subnet: a pod that is not hostNetwork gets an
// address of the subnet on the bridge inside that namespace, and reaches
// the node's end of the pair; deleting the namespace leaves no interface
// on the host.
func TestPodNetworkInNetNS(t *testing.T) {
	roottest.Require(t)
	ctx := t.Context()
	// Addresses of its own: not the defaults, which a node conformance
	// run on this machine may hold meanwhile.
	ns, err := NewNetNS(ctx, NetNSOptions{Name: "rntest",
		HostAddr: netip.MustParsePrefix("10.230.1.1/30"), NodeAddr: netip.MustParsePrefix("10.230.1.2/30")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(context.Background()); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat("/sys/class/net/" + ns.HostIf); !os.IsNotExist(err) {
			t.Errorf("the host end %s is still there after Delete: %v", ns.HostIf, err)
		}
	})
	if out, err := exec.Command("ip", "-n", ns.Name, "-br", "addr", "show", ns.NodeIf).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), ns.NodeAddr.String()) {
		t.Fatalf("the node's end in the namespace: %v: %s", err, out)
	}
	r := StartT(t, Options{NetNS: ns.Path, PodSubnet: "10.231.0.0/24"})
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "realnode", Uid: "uid-2"},
		LogDirectory: t.TempDir()}
	sb, err := r.CRI().RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v (containerd's log: %s)", err, r.Log())
	}
	st, err := r.CRI().PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(st.GetStatus().GetNetwork().GetIp())
	if err != nil || !netip.MustParsePrefix("10.231.0.0/24").Contains(ip) {
		t.Fatalf("the pod's address %q (%v), want one of 10.231.0.0/24", st.GetStatus().GetNetwork().GetIp(), err)
	}
	out := runContainer(t, r, sb.PodSandboxId, sbCfg, "ping -c 1 -W 5 "+ns.NodeAddr.Addr().String()+" >/dev/null && echo reached")
	if out != "reached" {
		t.Errorf("the pod did not reach the node's address %s: %q", ns.NodeAddr.Addr(), out)
	}
	if _, err := os.Stat("/sys/class/net/cni0"); !os.IsNotExist(err) {
		t.Errorf("a bridge cni0 is on the host: %v", err)
	}
}

// runContainer runs script by sh in a busybox container of sandbox id
// (config cfg) with mounts, waits until it exits 0 and returns what it
// printed, trimmed.
func runContainer(t *testing.T, r *Runtime, id string, cfg *runtimeapi.PodSandboxConfig, script string, mounts ...*runtimeapi.Mount) string {
	t.Helper()
	ctx, cri := t.Context(), r.CRI()
	c, err := cri.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: id, SandboxConfig: cfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
			Image:    &runtimeapi.ImageSpec{Image: BusyboxImage},
			Command:  []string{"sh", "-c", script},
			Mounts:   mounts,
			LogPath:  "c.log",
		}})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := cri.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.ContainerId})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			log, _ := os.ReadFile(filepath.Join(cfg.LogDirectory, "c.log"))
			if st.Status.ExitCode != 0 {
				t.Fatalf("the container exited %d: %s", st.Status.ExitCode, log)
			}
			return strings.TrimSpace(criLogText(string(log)))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container is %v after a minute", st.Status.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// criLogText is the text of a CRI log file ("{time} {stream} {tag} {text}"
// lines).
func criLogText(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 {
			b.WriteString(f[3])
		}
	}
	return b.String()
}

// TestStopCleansAfterACrash kills containerd while a container runs (as
// when a test's runtime dies): Stop finds the container and its shim,
// kills them, says so in its error, and leaves nothing.
func TestStopCleansAfterACrash(t *testing.T) {
	roottest.Require(t)
	ctx := t.Context()
	dir, err := os.MkdirTemp("", "rn-")
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := Busybox(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	pause, err := Pause(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(ctx, Options{Dir: dir, Images: []Image{busybox, pause}})
	if err != nil {
		t.Fatal(err)
	}
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "realnode", Uid: "uid-3"},
		LogDirectory: t.TempDir(), Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}}
	sb, err := r.CRI().RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.CRI().CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sbCfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
			Image: &runtimeapi.ImageSpec{Image: BusyboxImage}, Command: []string{"sleep", "3600"}, LogPath: "c.log"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CRI().StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.exited
	err = r.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "runc containers left") {
		t.Errorf("Stop after containerd died: %v, want it to name the runc containers it killed", err)
	}
	if pids := ProcessesNaming(dir); len(pids) > 0 {
		t.Errorf("processes left naming %s: %v", dir, pids)
	}
	if ms, err := MountsUnder(dir); err != nil || len(ms) > 0 {
		t.Errorf("mounts left below %s: %v, %v", dir, ms, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
	if out, _ := exec.Command("pgrep", "-f", "sleep 3600").Output(); len(out) > 0 {
		t.Errorf("the container's process is still running: %s", out)
	}
}

// TestDeleteNetNS removes a namespace left behind by its name alone, pair
// and all, and says so; a name with no namespace is no error.
func TestDeleteNetNS(t *testing.T) {
	roottest.Require(t)
	ctx := t.Context()
	ns, err := NewNetNS(ctx, NetNSOptions{Name: "rnstale",
		HostAddr: netip.MustParsePrefix("10.230.2.1/30"), NodeAddr: netip.MustParsePrefix("10.230.2.2/30")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete(context.Background()) })
	if found, err := DeleteNetNS(ctx, ns.Name); !found || err != nil {
		t.Fatalf("DeleteNetNS of a namespace there: %v, %v; want true, nil", found, err)
	}
	for _, p := range []string{ns.Path, "/sys/class/net/" + ns.HostIf} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
	if found, err := DeleteNetNS(ctx, ns.Name); found || err != nil {
		t.Errorf("DeleteNetNS of a namespace gone: %v, %v; want false, nil", found, err)
	}
}

// TestHostProgram lays out curl's and bash's files from HostProgram in an
// empty directory and runs each there, chrooted: nothing of the machine's
// but what the files name is needed.
func TestHostProgram(t *testing.T) {
	roottest.Require(t)
	for _, tc := range []struct {
		bin, path string
		args      []string
		want      string
	}{
		{"curl", "/usr/bin/curl", []string{"--version"}, "curl "},
		{"bash", "/bin/bash", []string{"-c", "echo from bash"}, "from bash"},
	} {
		bin, err := exec.LookPath(tc.bin)
		if err != nil {
			t.Fatalf("%s (Debian's %s): %v", tc.bin, tc.bin, err)
		}
		files, err := HostProgram(t.Context(), bin, tc.path)
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		for _, f := range files {
			data, err := os.ReadFile(f.Source)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(root, f.Path)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.CommandContext(t.Context(), "chroot", append([]string{root, tc.path}, tc.args...)...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), tc.want) {
			t.Errorf("%s in a root of its files: %q, %v; want %q", tc.bin, out, err, tc.want)
		}
	}
}

// TestBusyboxFilesLinksInBin checks that every applet is in /bin as well as
// at busybox's own place, as in upstream's image: specs run /bin/sysctl.
func TestBusyboxFilesLinksInBin(t *testing.T) {
	files, err := BusyboxFiles(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{}
	for _, f := range files {
		if _, dup := links[f.Path]; dup {
			t.Errorf("%s twice", f.Path)
		}
		links[f.Path] = f.Link
	}
	for p, want := range map[string]string{"/bin/sysctl": "busybox", "/sbin/sysctl": "../bin/busybox", "/bin/env": "busybox", "/usr/bin/env": "../../bin/busybox", "/bin/sh": "busybox"} {
		if links[p] != want {
			t.Errorf("%s links to %q, want %q", p, links[p], want)
		}
	}
}
