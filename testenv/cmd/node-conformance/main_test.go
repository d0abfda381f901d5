package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/testenv/realnode"
)

// TestSuites checks each suite's expressions against spec texts of the
// node e2e suite v1.37.2: what each runs and what it leaves out.
func TestSuites(t *testing.T) {
	for _, tc := range []struct {
		suite, spec string
		run         bool
	}{
		{"storage", "[sig-storage] ConfigMap should be consumable from pods in volume with mappings [Conformance] [NodeConformance]", true},
		{"storage", "[sig-storage] Downward API [Feature:EphemeralStorage] Downward API tests for local ephemeral storage should provide default limits.ephemeral-storage from node allocatable [Disruptive] [Serial]", true},
		{"storage", "[sig-node] Kubelet Volume Manager Volume Manager On termination of pod with memory backed volume should remove the volume from the node [NodeConformance]", true},
		{"storage", "[sig-node] Pod conditions managed by Kubelet [NodeConformance] a pod failing to mount volumes (Secret) and with init containers should report just the scheduled condition set", true},
		{"storage", "[sig-node] ImageVolume [Feature:ImageVolume] subPath should succeed when using a valid subPath", true},
		{"storage", "[sig-node] Variable Expansion should allow substituting values in a volume subpath [Conformance]", true},
		{"storage", "[sig-storage] EmptyDir volumes EmptyDirVolumeMode [LinuxOnly] [Feature:EmptyDirVolumeMode] [FeatureGate:EmptyDirVolumeMode] should set mode 0750 on emptyDir directory [Alpha] [Feature:OffByDefault]", false},
		{"storage", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", false},
		{"conformance", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", true},
		{"conformance", "[sig-node] ImageVolume [Feature:ImageVolume] subPath should succeed when using a valid subPath", false},
		{"conformance", "[sig-node] Pods should have their auto-restart back-off timer reset on image update [NodeConformance] [Slow]", false},
		{"conformance", "[sig-node] MirrorPod when create a mirror pod without changes should successfully recreate when file is removed and recreated [NodeConformance] [Serial]", false},
		{"conformance-slow", "[sig-node] Pods should have their auto-restart back-off timer reset on image update [NodeConformance] [Slow]", true},
		{"conformance-slow", "[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] mem restart resizing [It] only pod-level mem [Beta] [NodeConformance] [Slow]", true},
		{"conformance-slow", "[sig-node] MirrorPod when create a mirror pod without changes should successfully recreate when file is removed and recreated [NodeConformance] [Serial]", true},
		{"conformance-slow", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", false},
		{"conformance-slow", "[sig-node] LocalStorageEviction [Slow] [Serial] [Disruptive] [NodeFeature:Eviction] when we run containers that should cause DiskPressure  should eventually evict all of the correct pods", false},
		{"conformance-slow", "[sig-node] Some [Slow] [NodeConformance] spec [Flaky]", false},
		{"disruptive", "[sig-node] LocalStorageCapacityIsolationEviction [Feature:LocalStorageCapacityIsolationQuota] [Feature:Eviction] when we run containers that should cause evictions due to pod local storage violations  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"eviction", "[sig-node] LocalStorageCapacityIsolationEviction [Feature:LocalStorageCapacityIsolationQuota] [Feature:Eviction] when we run containers that should cause evictions due to pod local storage violations  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", true},
		{"eviction", "[sig-node] LocalStorageSoftEviction [Feature:Eviction] when we run containers that should cause DiskPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", true},
		{"eviction", "[sig-node] PriorityMemoryEvictionOrdering [Feature:Eviction] when we run containers that should cause MemoryPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"eviction", "[sig-node] LocalStorageCapacityIsolationFSQuotaMonitoring [Feature:LocalStorageCapacityIsolationQuota] [Feature:LSCIQuotaMonitoring] [Feature:UserNamespacesSupport] when we run containers that should cause use quotas for LSCI monitoring (quotas enabled: true, userNamespacesEnabled: false)  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"disruptive", "[sig-node] Unknown Pods when creating a mirror pod the static pod should be terminated and cleaned up due to becoming a unknown pod due to being force deleted while kubelet is not running [Disruptive] [Serial]", true},
		{"disruptive", "[sig-node] Restart Kubelet should correctly account for terminated pods after restart [Disruptive] [Serial] [Slow]", true},
		{"disruptive", "[sig-node] LocalStorageCapacityIsolationFSQuotaMonitoring [Feature:LocalStorageCapacityIsolationQuota] [Feature:LSCIQuotaMonitoring] [Feature:UserNamespacesSupport] when we run containers that should cause use quotas for LSCI monitoring (quotas enabled: true, userNamespacesEnabled: false)  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"disruptive", "[sig-node] PriorityMemoryEvictionOrdering [Feature:Eviction] when we run containers that should cause MemoryPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
	} {
		s, err := lookupSuite(tc.suite)
		if err != nil {
			t.Fatal(err)
		}
		run := regexp.MustCompile(s.focus).MatchString(tc.spec) && !regexp.MustCompile(s.skip).MatchString(tc.spec)
		if run != tc.run {
			t.Errorf("suite %s runs %q: %v, want %v", tc.suite, tc.spec, run, tc.run)
		}
	}
	if _, err := lookupSuite("nope"); err == nil {
		t.Error("lookupSuite(nope): no error")
	}
}

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
	out, err := pathWithout(filepath.Join(dir, "path"), "systemd-run")
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
	images, err := suiteImages(t.Context(), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "registry.k8s.io/pause:3.10.2", agnhostImage, nginxImage,
		glibcDNSImage, agnhostPrevImage, nonRootImage, nonewprivsImage, kittenImage, nautilusImage, devicePluginImage}
	var got []string
	for _, img := range images {
		got = append(got, img.Name)
		// agnhost's fake-registry-server serves pause:testing from the
		// image (the image pull specs pull it from a registry pod).
		if img.Name == agnhostImage && !slices.ContainsFunc(img.Files, func(f realnode.File) bool { return f.Path == "/var/registry/pause/manifests/testing" }) {
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
			dir, undo, err := runContainerdIn(work)
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
