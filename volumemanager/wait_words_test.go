package volumemanager

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// blockingMounter is a fake mounter whose mounts wait until release is
// closed: a tmpfs that takes long to mount.
type blockingMounter struct {
	*mount.FakeMounter
	release chan struct{}
}

func (m blockingMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	<-m.release
	return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
}

// TestWaitErrorNamesTheStep: a wait error that says what still runs uses
// the plugin's own words: the kubelet's step ("MountVolume.SetUp") for an
// emptyDir whose set-up hangs, never a CSI call it does not make.
func TestWaitErrorNamesTheStep(t *testing.T) {
	m := blockingMounter{FakeMounter: mount.NewFakeMounter(nil), release: make(chan struct{})}
	vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), Mounter: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	defer close(m.release)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "scratch", Source: v1.VolumeSource{
		EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}}}})
	vm.AddPod(pod)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = vm.WaitForAttachAndMount(short, pod)
	stop()
	if err == nil || !strings.Contains(err.Error(), `volume "scratch": MountVolume.SetUp still running after`) || strings.Contains(err.Error(), "NodePublishVolume") {
		t.Fatalf("WaitForAttachAndMount = %v; want it to say the emptyDir's MountVolume.SetUp still runs", err)
	}
}
