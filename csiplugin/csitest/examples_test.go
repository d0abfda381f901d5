package csitest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// The in-process driver is strict, records every request and fails calls
// on demand. Tests use New(t, opts), which stops it when the test ends.
func ExampleStart() {
	dir, err := os.MkdirTemp("", "csitest-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	drv, err := csitest.Start("", csitest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Stop()
	conn, err := grpc.NewClient("unix://"+drv.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	ctx := context.Background()
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	staging := filepath.Join(dir, "globalmount")

	// Publish before stage: the CSI spec's FailedPrecondition.
	_, err = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: filepath.Join(dir, "mount"), VolumeCapability: capability,
	})
	fmt.Println("publish first:", status.Code(err))

	// An injected fault, then the call that succeeds.
	drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Unavailable, "try again"), Times: 1})
	stage := &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, VolumeCapability: capability}
	_, err = node.NodeStageVolume(ctx, stage)
	fmt.Println("stage:", status.Code(err))
	_, err = node.NodeStageVolume(ctx, stage)
	fmt.Println("stage again:", status.Code(err))

	path, staged := drv.StagedVolumes()["vol-1"]
	fmt.Println("staged:", staged, path == staging)
	fmt.Println("NodeStageVolume calls:", drv.Calls("NodeStageVolume"))
	// Output:
	// publish first: FailedPrecondition
	// stage: Unavailable
	// stage again: OK
	// staged: true true
	// NodeStageVolume calls: 2
}

// The fake attacher plays the external-attacher: it attaches the
// VolumeAttachments it sees. AttachVolume plays the attach/detach
// controller, which creates them.
func ExampleRunFakeAttacher() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: "csi.example.com", Handle: "handle-1"})
	client := fake.NewClientset(pv)
	attacherCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- csitest.RunFakeAttacher(attacherCtx, client, csitest.AttacherOptions{Metadata: map[string]string{"lun": "3"}})
	}()

	va, err := csitest.AttachVolume(ctx, client, pv, "node-1")
	if err != nil {
		log.Fatal(err)
	}
	w, err := client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Stop()
	for !va.Status.Attached { // woken by each change the watch sees
		if va, err = client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{}); err != nil {
			log.Fatal(err)
		}
		if va.Status.Attached {
			break
		}
		select {
		case <-w.ResultChan():
		case <-ctx.Done():
			log.Fatal(ctx.Err())
		}
	}
	fmt.Println(va.Name == csiplugin.AttachmentName("handle-1", "csi.example.com", "node-1"), va.Status.Attached, va.Status.AttachmentMetadata)
	stop()
	<-done
	// Output:
	// true true map[lun:3]
}
