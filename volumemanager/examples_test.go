package volumemanager_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager"
	"github.com/nodevol/nodevol/volumemanager/vmtest"
)

// A user's unit test of code built on nodevol: the fake clientset, the test
// kit's in-process CSI driver, the fake external-attacher and the fake
// mounter; no root, no cluster. The driver's CSIDriver says attachRequired,
// so the VolumeAttachment the attach/detach controller would create is
// created with csitest.AttachVolume, and the fake attacher attaches it.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := os.MkdirTemp("", "nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)

	drv, err := csitest.Start("", csitest.Options{CreateTargetDirs: true})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Stop()
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-1"})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
	}}) // on node csitest.DefaultNodeID
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv)
	var wg sync.WaitGroup
	defer wg.Wait()
	attacherCtx, stopAttacher := context.WithCancel(ctx)
	defer stopAttacher()
	wg.Go(func() { _ = csitest.RunFakeAttacher(attacherCtx, client, csitest.AttacherOptions{}) })
	if _, err := csitest.AttachVolume(ctx, client, pv, csitest.DefaultNodeID); err != nil {
		log.Fatal(err)
	}

	vm, err := volumemanager.New(volumemanager.Config{
		NodeName:   csitest.DefaultNodeID,
		KubeClient: client,
		RootDir:    root,
		Mounter:    mount.NewFakeMounter(nil),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- vm.Run(runCtx) }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		log.Fatal(err)
	}

	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		log.Fatal(err)
	}
	for _, v := range vm.GetMountedVolumesForPod(pod.UID) {
		fmt.Println(v.SpecName, "->", strings.TrimPrefix(v.Path, root))
	}
	for _, target := range drv.PublishedVolumes()["handle-1"] {
		fmt.Println("published at", strings.TrimPrefix(target, root))
	}
	vm.DeletePod(pod) // once its containers have stopped
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		log.Fatal(err)
	}
	// The pod's mount is gone; the device is unstaged right after, as the
	// volume's last user has left.
	if err := drv.WaitForCalls(ctx, "NodeUnstageVolume", 1); err != nil {
		log.Fatal(err)
	}
	fmt.Println("calls:", drv.Calls("NodeStageVolume"), drv.Calls("NodePublishVolume"),
		drv.Calls("NodeUnpublishVolume"), drv.Calls("NodeUnstageVolume"))

	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// data -> /pods/594f4a66-ba05-6245-b8a7-b563c6b8916f/volumes/kubernetes.io~csi/pvc-b5fe969d-7989-bf00-9cdb-f195ad7198cd/mount
	// published at /pods/594f4a66-ba05-6245-b8a7-b563c6b8916f/volumes/kubernetes.io~csi/pvc-b5fe969d-7989-bf00-9cdb-f195ad7198cd/mount
	// calls: 1 1 1 1
}

// Run runs until its context ends, then returns once every operation it
// started has returned.
func ExampleVolumeManager_Run() {
	root, err := os.MkdirTemp("", "nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	vm, err := volumemanager.New(volumemanager.Config{
		NodeName:   "node-1",
		KubeClient: fake.NewClientset(),
		RootDir:    root,
		Mounter:    mount.NewFakeMounter(nil),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	// ... register drivers, add pods, wait for their volumes ...
	stop()
	fmt.Println("Run returned:", <-done)
	// Output:
	// Run returned: <nil>
}

// A pod's volumes are published under {root}/pods/{podUID}/volumes/kubernetes.io~csi/,
// each in a directory named as the kubelet names it: the PV's name for a
// claim (csitest.BoundClaim names it "pvc-{claim's UID}"), the pod's volume
// name for an inline CSI volume.
func ExampleVolumeManager_AddPod() {
	example(csitest.Options{CreateTargetDirs: true}, func(driver string) []runtime.Object {
		pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: driver, Handle: "handle-1"})
		return []runtime.Object{pvc, pv, csitest.CSIDriver(driver, csitest.CSIDriverSpec{LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}})}
	}, func(ctx context.Context, vm *volumemanager.VolumeManager, drv *csitest.Server, root string) {
		pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "data"},
			{Name: "scratch", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: drv.DriverName(), VolumeAttributes: map[string]string{"size": "1Gi"}}}},
		}})
		vm.AddPod(pod)
		if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
			log.Fatal(err)
		}
		for _, v := range vm.GetMountedVolumesForPod(pod.UID) {
			fmt.Println(v.SpecName, "->", strings.TrimPrefix(v.Path, root))
		}
	})
	// Output:
	// data -> /pods/594f4a66-ba05-6245-b8a7-b563c6b8916f/volumes/kubernetes.io~csi/pvc-b5fe969d-7989-bf00-9cdb-f195ad7198cd/mount
	// scratch -> /pods/594f4a66-ba05-6245-b8a7-b563c6b8916f/volumes/kubernetes.io~csi/scratch/mount
}

// WaitForAttachAndMount waits through failures that may resolve: here the
// driver fails its first NodeStageVolume, and the volume manager retries it
// after a backoff.
func ExampleVolumeManager_WaitForAttachAndMount() {
	example(csitest.Options{CreateTargetDirs: true}, func(driver string) []runtime.Object {
		pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: driver, Handle: "handle-1"})
		return []runtime.Object{pvc, pv, csitest.CSIDriver(driver, csitest.CSIDriverSpec{})}
	}, func(ctx context.Context, vm *volumemanager.VolumeManager, drv *csitest.Server, root string) {
		drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "disk busy"), Times: 1})
		pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
		vm.AddPod(pod)
		if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
			log.Fatal(err)
		}
		fmt.Println("NodeStageVolume calls:", drv.Calls("NodeStageVolume"))
		fmt.Println("mounted:", len(vm.GetMountedVolumesForPod(pod.UID)))
	})
	// Output:
	// NodeStageVolume calls: 2
	// mounted: 1
}

// example runs body against a running VolumeManager on node
// csitest.DefaultNodeID, with a fake clientset holding objects(driver name),
// the test kit's driver registered and the fake mounter; root is the
// manager's RootDir.
func example(opts csitest.Options, objects func(driver string) []runtime.Object,
	body func(ctx context.Context, vm *volumemanager.VolumeManager, drv *csitest.Server, root string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := os.MkdirTemp("", "nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	drv, err := csitest.Start("", opts)
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Stop()
	vm, err := volumemanager.New(volumemanager.Config{
		NodeName:   csitest.DefaultNodeID,
		KubeClient: fake.NewClientset(objects(drv.DriverName())...),
		RootDir:    root,
		Mounter:    mount.NewFakeMounter(nil),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- vm.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			log.Fatal(err)
		}
	}()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		log.Fatal(err)
	}
	body(ctx, vm, drv, root)
}

// With PluginRegistration, Run watches {RootDir}/plugins_registry, where
// each CSI driver's node-driver-registrar (here the test kit's Registrar)
// announces it; the driver is then registered and recorded on the Node and
// its CSINode, as the kubelet does.
func ExampleConfig_pluginRegistration() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Under /tmp: the registrar's socket in root/plugins_registry must fit
	// in a unix socket path (108 bytes), whatever $TMPDIR is.
	root, err := csitest.ShortTempDir("nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	drv, err := csitest.Start("", csitest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Stop()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: csitest.DefaultNodeID}}
	client := fake.NewClientset(node)

	vm, err := volumemanager.New(volumemanager.Config{
		NodeName:           csitest.DefaultNodeID,
		KubeClient:         client,
		RootDir:            root,
		Mounter:            mount.NewFakeMounter(nil),
		PluginRegistration: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- vm.Run(runCtx) }()

	regDir := filepath.Join(root, "plugins_registry")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		log.Fatal(err)
	}
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{
		Dir: regDir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint(),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Stop()
	st, err := reg.WaitForStatus(ctx, 1) // NotifyRegistrationStatus
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("registered:", st.Registered)
	n, err := client.CoreV1().Nodes().Get(ctx, csitest.DefaultNodeID, metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("node annotation:", n.Annotations["csi.volume.kubernetes.io/nodeid"])
	csiNode, err := client.StorageV1().CSINodes().Get(ctx, csitest.DefaultNodeID, metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range csiNode.Spec.Drivers {
		fmt.Println("CSINode driver:", d.Name, d.NodeID)
	}

	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// registered: true
	// node annotation: {"csitest.nodevol.io":"node-1"}
	// CSINode driver: csitest.nodevol.io node-1
}

// TestREADMETestKit is the README's test-kit snippet, kept compiling and
// working: a user's unit test of code built on nodevol.
func TestREADMETestKit(t *testing.T) {
	// The snippet, as in README.md:
	ctx := t.Context()
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: csitest.DefaultDriverName, Handle: "handle-1"}) // bound PVC/PV
	env := vmtest.NewEnv(t, vmtest.EnvOptions{Objects: []runtime.Object{pvc, pv}, AttachRequired: true})
	env.Driver.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "boom"), Times: 1})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{ // on node env.Node
		Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}, // claim ns/data mounted at /mnt/data
	})
	if err := env.Manager.AddPod(pod); err != nil { // refused only for a pod of another node
		t.Fatal(err)
	}
	if err := env.Manager.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	for _, r := range env.Driver.Requests() { // every request, in order: r.Method, r.VolumeID, r.Req
		if r.Method == "NodePublishVolume" && r.VolumeID != "handle-1" {
			t.Errorf("published %s", r.VolumeID)
		}
	}
	// The snippet's assertions:
	if got := env.Driver.Calls("NodeStageVolume"); got != 2 {
		t.Errorf("NodeStageVolume calls = %d, want 2 (one failed, one retried)", got)
	}
	if got := env.Driver.Calls("NodePublishVolume"); got != 1 {
		t.Errorf("NodePublishVolume calls = %d, want 1", got)
	}
	if got := len(env.Driver.Requests()); got == 0 {
		t.Error("no request recorded")
	}
	if got := env.Driver.PublishedVolumes()["handle-1"]; len(got) != 1 {
		t.Errorf("handle-1 published at %v, want one target", got)
	}
	vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vas.Items) != 1 || !vas.Items[0].Status.Attached || vas.Items[0].Spec.NodeName != env.Node {
		t.Errorf("VolumeAttachments = %+v, want the volume's, attached to %s", vas.Items, env.Node)
	}
	// The snippet, continued:
	env.Manager.DeletePod(pod)
	if err := env.Manager.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := env.Driver.PublishedVolumes()["handle-1"]; len(got) != 0 {
		t.Errorf("handle-1 still published at %v", got)
	}

	env = vmtest.NewEnv(t, vmtest.EnvOptions{Configure: func(c *volumemanager.Config) {
		c.ClaimPendingGracePeriod = 100 * time.Millisecond
	}})
	err = env.Manager.WaitForAttachAndMount(ctx, csitest.Pod("ns", "db", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "nope"},
	}}))
	if !errors.Is(err, volumemanager.ErrFinal) {
		t.Fatalf("got %v, want a final error naming claim ns/nope", err)
	}
	// The snippet's assertions:
	if !strings.Contains(err.Error(), "ns/nope") {
		t.Errorf("the error does not name the claim: %v", err)
	}
}

// An agent that runs containers resolves their environment from the same
// cache that keeps the pods' configMap and secret volumes current: each
// configMap and secret a pod's containers read (env valueFrom, envFrom,
// imagePullSecrets) is held from AddPod to DeletePod, watched meanwhile,
// and read through Objects, with no cache of the agent's own.
func ExampleVolumeManager_Objects() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := os.MkdirTemp("", "nodevol-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	client := fake.NewClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"LOG_LEVEL": "debug"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"}, Data: map[string][]byte{"password": []byte("s3cret")}})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{})
	pod.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}}
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "DB_PASSWORD", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
		LocalObjectReference: v1.LocalObjectReference{Name: "db"}, Key: "password"}}}}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: csitest.DefaultNodeID, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- vm.Run(runCtx) }()

	if err := vm.AddPod(pod); err != nil {
		log.Fatal(err)
	}
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		log.Fatal(err)
	}
	// Before the container starts: its environment, as the kubelet makes it.
	objs := vm.Objects()
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		cm, err := objs.ConfigMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
		if err != nil {
			log.Fatal(err) // a missing configMap: the container waits, as with the kubelet
		}
		maps.Copy(env, cm.Data)
	}
	for _, e := range c.Env {
		ref := e.ValueFrom.SecretKeyRef
		s, err := objs.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			log.Fatal(err)
		}
		env[e.Name] = string(s.Data[ref.Key])
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Printf("%s=%s\n", k, env[k])
	}

	vm.DeletePod(pod) // its containers have stopped: its objects are let go
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		log.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// DB_PASSWORD=s3cret
	// LOG_LEVEL=debug
}
