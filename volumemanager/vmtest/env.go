package vmtest

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume/subpath/subpathtest"
	"github.com/nodevol/nodevol/volumemanager"
)

// EnvOptions configure NewEnv. The zero value is a driver that needs no
// attaching and a manager with Config's defaults.
type EnvOptions struct {
	// Objects are added to the fake clientset beside the Node and the
	// driver's CSIDriver: PVCs and PVs (csitest.BoundClaim), Secrets, ...
	// Default none.
	Objects []runtime.Object
	// AttachRequired is the driver's CSIDriver spec.attachRequired: when
	// true, the fake attacher creates and attaches each PV's
	// VolumeAttachment, as the attach/detach controller and the
	// external-attacher would. Default false.
	AttachRequired bool
	// Driver configures the in-process CSI driver; CreateTargetDirs is
	// always set (the fake mounter creates no directories). Default: the
	// driver csitest.DefaultDriverName with csitest's defaults.
	Driver csitest.Options
	// Attacher configures the fake attacher (delay, metadata, failures);
	// its Node and Driver are set by NewEnv. Default: attach at once.
	Attacher csitest.AttacherOptions
	// Configure, if set, changes the manager's Config before New, e.g. to
	// set a Registerer or an EventRecorder, or to shorten
	// ClaimPendingGracePeriod (5 s by default) so that a test of a missing
	// claim gets its final error at once. NodeName, KubeClient, RootDir
	// and Mounter are set already.
	Configure func(*volumemanager.Config)
}

// Env is a running VolumeManager on fakes, made by NewEnv.
type Env struct {
	// Manager runs until the test ends. Add pods to it, wait for them, and
	// check what it did.
	Manager *volumemanager.VolumeManager
	// Config is the Config the Manager was made with.
	Config volumemanager.Config
	// Client is the fake clientset: the Node, the CSIDriver, the objects
	// of EnvOptions and the VolumeAttachments the fake attacher made.
	Client *fake.Clientset
	// Driver is the in-process CSI driver, registered with Manager: it
	// records every request (Calls, Requests, Published) and injects
	// faults (Inject).
	Driver *csitest.Server
	// Mounter is the fake mounter the Manager mounts and checks mount
	// points with, through Binds.
	Mounter *mount.FakeMounter
	// Binds is the Manager's Config.Mounter: Mounter, recording what each
	// bind mount binds, so that the subPath bind mounts of
	// Manager.SubPaths().Prepare work on it (their check asks it) and a
	// test can see what a subPath's target is bound to (Bound).
	Binds *subpathtest.Mounter
	// RootDir is the Manager's root directory, in t.TempDir().
	RootDir string
	// Node is the node's name, csitest.DefaultNodeID (the name
	// csitest.Pod schedules pods to).
	Node string
}

// NewEnv starts a VolumeManager for a unit test: a fake clientset with
// the Node and the driver's CSIDriver, the in-process CSI driver on a unix
// socket registered with the manager, the fake attacher playing the
// attach/detach controller and the external-attacher for the node, a
// temporary root directory and the fake mounter (on which subPath bind
// mounts work: Binds). When the test ends, the
// manager is stopped and waited for (its Run error fails the test), then
// the attacher and the driver. It fails the test if anything cannot start.
func NewEnv(tb testing.TB, opts EnvOptions) *Env {
	tb.Helper()
	opts.Driver.CreateTargetDirs = true
	drv := csitest.New(tb, opts.Driver)
	e := &Env{Driver: drv, RootDir: tb.TempDir(), Node: csitest.DefaultNodeID, Mounter: mount.NewFakeMounter(nil)}
	e.Binds = subpathtest.NewMounter(e.Mounter)
	objs := append([]runtime.Object{
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.Node}},
		csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: opts.AttachRequired}),
	}, opts.Objects...)
	e.Client = fake.NewClientset(objs...)
	attacher := opts.Attacher
	attacher.Node, attacher.Driver = e.Node, drv.DriverName()
	csitest.NewFakeAttacher(tb, e.Client, attacher)

	e.Config = volumemanager.Config{NodeName: e.Node, KubeClient: e.Client, RootDir: e.RootDir, Mounter: e.Binds}
	if opts.Configure != nil {
		opts.Configure(&e.Config)
	}
	vm, err := volumemanager.New(e.Config)
	if err != nil {
		tb.Fatalf("vmtest: %v", err)
	}
	e.Manager = vm
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("vmtest: Run: %v", err)
		}
	})
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		tb.Fatalf("vmtest: registering driver %s: %v", drv.DriverName(), err)
	}
	return e
}
