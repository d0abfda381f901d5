package noderun

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/internal/roottest"
)

// TestPathWithout makes a PATH directory with every command of the
// given PATH but the ones named, the first of a name winning.
func TestPathWithout(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, f := range []string{filepath.Join(a, "tool"), filepath.Join(a, "systemd-run"), filepath.Join(b, "tool"), filepath.Join(b, "other")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", a+string(filepath.ListSeparator)+b)
	out, err := PathWithout(filepath.Join(dir, "path"), "systemd-run")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"tool": filepath.Join(a, "tool"), "other": filepath.Join(b, "other")}
	entries, _ := os.ReadDir(out)
	if len(entries) != len(want) {
		t.Errorf("the PATH directory holds %v, want %v", entries, want)
	}
	for name, target := range want {
		if got, err := os.Readlink(filepath.Join(out, name)); err != nil || got != target {
			t.Errorf("%s -> %q (%v), want %q", name, got, err, target)
		}
	}
}

// TestSuiteImages builds every image from a bin directory laid out as
// make conformance-bins lays it out: each has the suite's name, once, and
// writes as an archive.
func TestSuiteImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pause command: not under -short")
	}
	bin := t.TempDir()
	// A static busybox, as the one make conformance-bins builds is.
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("the images need a static busybox (Debian's busybox-static): %v", err)
	}
	// nginx is Debian's, dynamically linked; any program will do here.
	for name, target := range map[string]string{"busybox": busybox, "nginx": "/bin/bash"} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"agnhost", "sample-device-plugin", "image-files/nnp", "image-files/localhost.crt", "image-files/localhost.key",
		"image-files/kitten/kitten.jpg", "image-files/kitten/data.json", "image-files/nautilus/nautilus.jpg", "image-files/nautilus/data.json"} {
		p := filepath.Join(bin, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	images, err := SuiteImages(t.Context(), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "registry.k8s.io/pause:3.10.2", AgnhostImage, NginxImage,
		GlibcDNSImage, AgnhostPrevImage, NonRootImage, NonewprivsImage, KittenImage, NautilusImage, DevicePluginImage}
	var got []string
	for _, img := range images {
		got = append(got, img.Name)
		// agnhost's fake-registry-server serves pause:testing from the
		// image (the image pull specs pull it from a registry pod).
		if img.Name == AgnhostImage && !slices.ContainsFunc(img.Files, func(f realnode.File) bool { return f.Path == "/var/registry/pause/manifests/testing" }) {
			t.Errorf("image %s has no /var/registry/pause/manifests/testing", img.Name)
		}
		if err := realnode.WriteArchive(img, filepath.Join(t.TempDir(), "img.tar")); err != nil {
			t.Errorf("image %s: %v", img.Name, err)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("images %q, want %q", got, want)
	}
}

// TestRunContainerdIn: in a mount namespace of its own (as the run has),
// /run/containerd shows the run's directory until the undo, and the
// machine's /run/containerd is not touched.
func TestRunContainerdIn(t *testing.T) {
	roottest.Require(t)
	work := t.TempDir()
	done := make(chan error, 1)
	go func() {
		// The thread keeps the namespace and dies with the goroutine
		// (never unlocked), so no other goroutine runs in it.
		runtime.LockOSThread()
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
				return err
			}
			dir, undo, err := RunContainerdIn(work)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "probe"), nil, 0o600); err != nil {
				return err
			}
			if _, err := os.Stat("/run/containerd/probe"); err != nil {
				return fmt.Errorf("the run's directory is not at /run/containerd: %w", err)
			}
			if err := undo(); err != nil {
				return err
			}
			if _, err := os.Stat("/run/containerd/probe"); !os.IsNotExist(err) {
				return fmt.Errorf("/run/containerd/probe after the undo: %v", err)
			}
			return nil
		}()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/containerd/probe"); !os.IsNotExist(err) {
		t.Errorf("the machine's /run/containerd shows the run's directory: %v", err)
	}
}

// TestUndo takes things down last made first, every one of them even when
// one fails, and returns what failed.
func TestUndo(t *testing.T) {
	var undo Undo
	var order []int
	for i := range 3 {
		undo.Add(func() error {
			order = append(order, i)
			if i == 1 {
				return fmt.Errorf("undo %d", i)
			}
			return nil
		})
	}
	err := undo.Run()
	if !slices.Equal(order, []int{2, 1, 0}) {
		t.Errorf("order %v, want [2 1 0]", order)
	}
	if err == nil || err.Error() != "undo 1" {
		t.Errorf("error %v, want undo 1", err)
	}
}
