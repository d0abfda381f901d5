package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	k8scache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/image"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// TestScenarios runs the scripts in testdata/: each drives the reconcile
// loop step by step (no goroutines, no sleeps, a fake clock), with the
// operations it starts recorded instead of run, and prints what the loop
// started and the state it reached. Run with -rewrite to update them.
//
// Commands (arguments key=value):
//
//	claim name=a [driver=drv] [block] [rwop|rwx] [no-node-expansion]
//	                                       a PVC ns/a bound to PV pv-a, handle h-a, 1Gi
//	                                       (ReadWriteOnce, ReadWriteOncePod or ReadWriteMany;
//	                                       annotated volume.kubernetes.io/node-expansion-not-required)
//	unbind name=a                          the PVC goes (its pods cannot be resolved)
//	pod name=p claims=(a,b) [block=(a)] [level=s0:c1] [images=(t)]
//	                                       AddPod (uid uid-p), with that SELinux level and
//	                                       image volumes img-t (reference registry.example/t)
//	selinux-mount driver=drv               the driver's CSIDriver sets seLinuxMount
//	                                       (the host has SELinux enabled in every script)
//	delete-pod name=p                      DeletePod
//	mark-synced                            MarkPodsSynced
//	informers-synced                       the informers have listed once
//	step                                   the loop takes its inbox and plans
//	finish [id=N] [result=ok|uncertain|fail|notready|inuse|refused]
//	                                       an operation in flight returns (default: all, ok;
//	                                       refused: the driver refused its node expansion)
//	settle                                 finish every operation ok until none runs
//	advance d=1s                           the clock moves; backoffs that end are planned
//	resync                                 the periodic resync
//	driver name=drv                        a driver (re-)registers
//	restart [corrupt=(p/a)] [synced-early] [no-device=(a)]
//	                                       the agent dies: operations in flight are lost,
//	                                       the disk is what the plugin would have left
//	                                       (pod volume directories for possibly mounted
//	                                       pod mounts, staging directories for possibly
//	                                       staged devices); a new loop reads it back
//	attach-held names=(a)                  attachments wait to be reported in use
//	reported name=a                        volume a is reported in use
//	requires-republish driver=drv          the driver's CSIDriver sets requiresRepublish
//	expand name=a size=2Gi [status=S] [allocated=Q]
//	                                       the PV grows to size and the claim's storage resize
//	                                       status becomes S (default NodeResizePending), its
//	                                       allocated size Q (default none: an older resizer); with
//	                                       status=done another node (or the controller alone)
//	                                       finished: the claim's capacity is size, no resize status
//	size name=a                            the size this node has volume a at (0: not known)
//	self-attach                            the node attaches volumes itself (Config.SelfAttach),
//	                                       from now on and after restarts
//	va-changed name=a                      volume a's VolumeAttachment changed (informer event)
//	state                                  prints the actual state and what waits
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		s := newScenario(t)
		datadriven.RunTest(t, path, s.run)
	})
}

type scenario struct {
	t       *testing.T
	root    string
	clock   *clocktesting.FakeClock
	pvcs    k8scache.Indexer
	pvs     k8scache.Indexer
	drivers k8scache.Indexer
	in      *reconciler.Inbox
	asw     *state.ActualStateOfWorld
	dsw     *state.DesiredStateOfWorld
	l       *reconciler.Loop
	ops     map[int]startedOp
	nextID  int
	out     []string
	held    map[podvol.UniqueVolumeName]bool
	// selfAttach is Config.SelfAttach.
	selfAttach bool
	// reg holds the loops' metrics, across restarts.
	reg *prometheus.Registry
}

type startedOp struct {
	a  oe.Action
	in reconciler.Input
}

func newScenario(t *testing.T) *scenario {
	s := &scenario{
		t:       t,
		root:    t.TempDir(),
		clock:   clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		pvcs:    k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{k8scache.NamespaceIndex: k8scache.MetaNamespaceIndexFunc}),
		pvs:     k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{}),
		drivers: k8scache.NewIndexer(k8scache.MetaNamespaceKeyFunc, k8scache.Indexers{}),
		held:    map[podvol.UniqueVolumeName]bool{},
		reg:     prometheus.NewRegistry(),
	}
	s.in = reconciler.NewInbox()
	s.newLoop()
	return s
}

// newLoop builds a loop as New does, on fresh caches.
func (s *scenario) newLoop() {
	var l *reconciler.Loop
	s.dsw = state.NewDesiredStateOfWorld(func(n podvol.UniqueVolumeName) { l.MarkDirty(n) })
	s.asw = state.NewActualStateOfWorld()
	m, err := reconciler.NewMetrics(s.reg)
	if err != nil {
		s.t.Fatal(err)
	}
	res := &resolve.Resolver{Plugins: testPlugins, PVCs: corelisters.NewPersistentVolumeClaimLister(s.pvcs), PVs: corelisters.NewPersistentVolumeLister(s.pvs),
		CSIDrivers: storagelisters.NewCSIDriverLister(s.drivers), SELinuxEnabled: true, Metrics: m}
	volumes, err := volume.NewRegistry(scenarioPlugin{drivers: storagelisters.NewCSIDriverLister(s.drivers)}, image.New())
	if err != nil {
		s.t.Fatal(err)
	}
	l = reconciler.New(reconciler.Config{
		Node: "node-1", Clock: s.clock, Volumes: volumes, Metrics: m,
		DSW: s.dsw, ASW: s.asw, SelfAttach: s.selfAttach, Expands: true,
		Host: testHost{onStart: s.start, held: func(name podvol.UniqueVolumeName) bool { return s.held[name] }},
	}, s.in, resolve.NewTable(res, s.clock))
	s.ops = map[int]startedOp{}
	s.l = l
}

// scenarioPlugin is the CSI plugin as the planner sees it in the scripts:
// its capabilities, from the CSIDriver objects (every driver registered
// and staging); the operations are recorded, never run.
type scenarioPlugin struct {
	drivers storagelisters.CSIDriverLister
}

func (scenarioPlugin) Name() string                 { return podvol.CSIPluginName }
func (scenarioPlugin) CanSupport(v *v1.Volume) bool { return v.PersistentVolumeClaim != nil }
func (scenarioPlugin) SetUp(context.Context, volume.MountRequest) (string, error) {
	return "", errors.New("the scripts record operations")
}
func (scenarioPlugin) TearDown(context.Context, volume.MountRequest) error {
	return errors.New("the scripts record operations")
}

func (p scenarioPlugin) Capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	d, _ := p.drivers.Get(spec.Driver)
	return volume.Capabilities{
		Attachable: !spec.Ephemeral && (d == nil || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired),
		Stages:     !spec.Ephemeral,
		Block:      true,
		Republish:  d != nil && d.Spec.RequiresRepublish != nil && *d.Spec.RequiresRepublish,
		// As the CSI plugin: the driver refreshes, not the pod's objects.
		RepublishAtResyncOnly: true,
	}, nil
}

// AttachmentName names a volume's VolumeAttachment as the CSI plugin does
// on node-1 (volume.AttachmentNamer).
func (scenarioPlugin) AttachmentName(spec *podvol.VolumeSpec) string {
	return csiplugin.AttachmentName(spec.VolumeHandle, spec.Driver, "node-1")
}

// start records an operation the loop starts instead of running it.
func (s *scenario) start(a oe.Action, in reconciler.Input) {
	s.nextID++
	s.ops[s.nextID] = startedOp{a: a, in: in}
	line := fmt.Sprintf("start #%d %s", s.nextID, s.action(a, in.Spec.Mode))
	if a.Kind == oe.OpExpand {
		line += fmt.Sprintf(" to=%d", in.Expansion.Size)
	}
	s.out = append(s.out, line)
}

func short(n podvol.UniqueVolumeName) string {
	return strings.TrimPrefix(string(n), podvol.CSIPluginName+"/")
}

func (s *scenario) action(a oe.Action, mode podvol.VolumeMode) string {
	out := a.Kind.NameFor(mode) + " " + short(a.Volume)
	if a.Kind == oe.OpPublish || a.Kind == oe.OpUnpublish {
		out += " pod=" + string(a.Pod.Pod.UID)
	}
	c := a.Pod.SELinuxLabel // a publish's context
	if a.Kind == oe.OpStage {
		c = a.SELinuxContext // a stage names its pod too, for its fsGroup
	}
	if c != "" && a.Kind != oe.OpUnpublish {
		out += fmt.Sprintf(" context=%q", c)
	}
	if a.Expand > 0 {
		out += fmt.Sprintf(" expand=%d", a.Expand)
	}
	if a.Republish {
		out += " republish"
	}
	return out
}

func volName(claim string) podvol.UniqueVolumeName {
	return podvol.CSIVolumeName("drv", "h-"+claim)
}

func (s *scenario) run(t *testing.T, td *datadriven.TestData) string {
	s.out = nil
	ctx := context.Background()
	arg := func(key string) string {
		var v string
		if td.HasArg(key) {
			td.ScanArgs(t, key, &v)
		}
		return v
	}
	list := func(key string) []string {
		for _, a := range td.CmdArgs {
			if a.Key == key {
				return a.Vals
			}
		}
		return nil
	}
	switch td.Cmd {
	case "claim":
		access := v1.ReadWriteOnce
		switch {
		case td.HasArg("rwop"):
			access = v1.ReadWriteOncePod
		case td.HasArg("rwx"):
			access = v1.ReadWriteMany
		}
		s.claim(arg("name"), td.HasArg("block"), access, td.HasArg("no-node-expansion"))
	case "unbind":
		if err := s.pvcs.Delete(&v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: arg("name")}}); err != nil {
			t.Fatal(err)
		}
		s.in.Claim("ns/" + arg("name"))
	case "pod":
		pod := scenarioPod(arg("name"), list("claims"), list("block"))
		for _, img := range list("images") {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "img-" + img, VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry.example/" + img}}})
			pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "img-" + img, MountPath: "/" + img})
		}
		if l := arg("level"); l != "" {
			pod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: l}}
			if td.HasArg("recursive") {
				recursive := v1.SELinuxChangePolicyRecursive
				pod.Spec.SecurityContext.SELinuxChangePolicy = &recursive
			}
		}
		s.in.AddPod(keptOf(pod), nil)
	case "selinux-mount":
		yes := true
		if err := s.drivers.Add(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: arg("driver")}, Spec: storagev1.CSIDriverSpec{SELinuxMount: &yes}}); err != nil {
			t.Fatal(err)
		}
	case "delete-pod":
		s.in.DeletePod(types.UID("uid-" + arg("name")))
	case "mark-synced":
		s.in.MarkPodsSynced()
	case "informers-synced":
		s.in.MarkInformersSynced()
	case "step":
		s.l.Process(ctx)
	case "finish":
		ids := s.inFlight()
		if td.HasArg("id") {
			var id int
			td.ScanArgs(t, "id", &id)
			ids = []int{id}
		}
		result := arg("result")
		for _, id := range ids {
			s.finish(t, id, result)
		}
		s.l.Process(ctx)
	case "settle":
		for i := 0; len(s.ops) > 0; i++ {
			if i > 100 {
				t.Fatal("does not settle")
			}
			for _, id := range s.inFlight() {
				s.finish(t, id, "ok")
			}
			s.l.Process(ctx)
		}
	case "advance":
		d, err := time.ParseDuration(arg("d"))
		if err != nil {
			t.Fatal(err)
		}
		s.clock.Step(d)
		s.l.Due()
		s.l.Process(ctx)
	case "resync":
		s.l.Resync()
		s.l.Process(ctx)
	case "driver":
		s.in.Driver(arg("name"))
		s.l.Process(ctx)
	case "restart":
		s.restart(ctx, t, list("corrupt"), list("no-device"), td.HasArg("synced-early"))
	case "attach-held":
		for _, n := range list("names") {
			s.held[volName(n)] = true
		}
	case "reported":
		delete(s.held, volName(arg("name")))
		s.in.Retry(volName(arg("name")))
		s.l.Process(ctx)
	case "requires-republish":
		yes := true
		if err := s.drivers.Add(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: arg("driver")}, Spec: storagev1.CSIDriverSpec{RequiresRepublish: &yes}}); err != nil {
			t.Fatal(err)
		}
	case "expand":
		s.expand(t, arg("name"), arg("size"), arg("status"), arg("allocated"))
		s.l.Process(ctx)
	case "self-attach":
		s.selfAttach, s.l.SelfAttach = true, true
	case "size":
		v, _ := s.asw.Volume(volName(arg("name")))
		return resource.NewQuantity(v.Size, resource.BinarySI).String()
	case "va-changed":
		s.in.Attachment(csiplugin.AttachmentName("h-"+arg("name"), "drv", "node-1"))
		s.l.Process(ctx)
	case "state":
		return strings.ReplaceAll(s.state(), s.root, "{root}")
	case "selinux-metrics":
		return samples(t, s.reg, seLinuxMetricNames...)
	default:
		t.Fatalf("unknown command %q", td.Cmd)
	}
	if len(s.out) == 0 {
		return "ok"
	}
	return strings.ReplaceAll(strings.Join(s.out, "\n"), s.root, "{root}")
}

func (s *scenario) inFlight() []int {
	ids := make([]int, 0, len(s.ops))
	for id := range s.ops {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// finish delivers operation id's outcome to the loop.
func (s *scenario) finish(t *testing.T, id int, result string) {
	op, ok := s.ops[id]
	if !ok {
		t.Fatalf("no operation #%d in flight", id)
	}
	delete(s.ops, id)
	o := oe.Outcome{Action: op.a, Spec: op.in.Spec}
	switch result {
	case "", "ok":
		switch op.a.Kind {
		case oe.OpStage:
			o.Path = "/stage/" + op.in.Spec.VolumeHandle
		case oe.OpPublish:
			o.Path = "/pods/" + string(op.a.Pod.Pod.UID) + "/" + op.a.Pod.SpecName
		case oe.OpSelfAttach:
			o.PublishContext = map[string]string{} // attached through a VolumeAttachment
		}
		if op.a.Kind == oe.OpExpand || op.a.Expand > 0 {
			o.Expansion.Size = op.in.Expansion.Size
		}
	case "refused": // a node expansion the driver refused as infeasible
		o.Expansion = oe.ExpandResult{Held: op.in.Expansion.Size, HeldClaim: op.in.Expansion.ClaimRV}
	case "uncertain":
		o.Err, o.Uncertain = fmt.Errorf("rpc error: code = DeadlineExceeded: %w", volume.ErrInProgress), true
	case "fail":
		o.Err = errors.New("rpc error: code = Internal desc = no luck")
	case "notready":
		o.Err = fmt.Errorf("driver drv not registered: %w", volume.ErrNotReady)
	case "inuse":
		o.Err = &volume.InUseError{Path: op.in.DeviceMountPath, Refs: []string{s.root + "/pods/other/volumes/kubernetes.io~csi/x/mount"}}
	default:
		t.Fatalf("unknown result %q", result)
	}
	if o.Err != nil {
		o.Err = oe.OpError(op.a, op.in.Spec, o.Err)
	}
	s.out = append(s.out, fmt.Sprintf("finish #%d %s: %s", id, s.action(op.a, op.in.Spec.Mode), orOK(result)))
	s.l.Apply(o)
}

func orOK(r string) string {
	if r == "" {
		return "ok"
	}
	return r
}

func (s *scenario) claim(name string, block bool, access v1.PersistentVolumeAccessMode, noNodeExpansion bool) {
	mode := v1.PersistentVolumeFilesystem
	if block {
		mode = v1.PersistentVolumeBlock
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []v1.PersistentVolumeAccessMode{access},
			VolumeMode:             &mode,
			ClaimRef:               &v1.ObjectReference{Namespace: "ns", Name: name, UID: types.UID("pvc-" + name)},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "drv", VolumeHandle: "h-" + name}},
		},
	}
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pvc-" + name)},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pv.Name, VolumeMode: &mode, AccessModes: []v1.PersistentVolumeAccessMode{access}},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
	}
	if noNodeExpansion {
		pvc.Annotations = map[string]string{planner.NodeExpansionNotRequired: "true"}
	}
	if err := s.pvs.Add(pv); err != nil {
		s.t.Fatal(err)
	}
	if err := s.pvcs.Add(pvc); err != nil {
		s.t.Fatal(err)
	}
	s.in.Claim("ns/" + name)
}

func (s *scenario) expand(t *testing.T, name, size, status, allocated string) {
	obj, ok, _ := s.pvs.GetByKey("pv-" + name)
	if !ok {
		t.Fatalf("no PV pv-%s", name)
	}
	pv := obj.(*v1.PersistentVolume).DeepCopy()
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse(size)
	obj, _, _ = s.pvcs.GetByKey("ns/" + name)
	pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
	if status == "" {
		status = string(v1.PersistentVolumeClaimNodeResizePending)
	}
	pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.ClaimResourceStatus(status)}
	pvc.Status.AllocatedResources = nil
	if allocated != "" {
		pvc.Status.AllocatedResources = v1.ResourceList{v1.ResourceStorage: resource.MustParse(allocated)}
	}
	pvc.ResourceVersion = fmt.Sprint(s.nextID) + "-" + size + "-" + status + "-" + allocated // a new version of the claim
	if status == "done" {
		pvc.Status.AllocatedResourceStatuses = nil
		pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
	}
	if err := s.pvs.Update(pv); err != nil {
		t.Fatal(err)
	}
	if err := s.pvcs.Update(pvc); err != nil {
		t.Fatal(err)
	}
	s.in.Claim("ns/" + name)
}

func scenarioPod(name string, claims, block []string) *v1.Pod {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
	c := v1.Container{Name: "c"}
	isBlock := map[string]bool{}
	for _, b := range block {
		isBlock[b] = true
	}
	for _, cl := range claims {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "vol-" + cl, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: cl}}})
		if isBlock[cl] {
			c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: "vol-" + cl, DevicePath: "/dev/" + cl})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "vol-" + cl, MountPath: "/" + cl})
		}
	}
	pod.Spec.Containers = []v1.Container{c}
	return pod
}

// restart is a crash of the agent: the disk keeps what the plugin wrote
// for everything that may be set up; a new loop reads it back.
func (s *scenario) restart(ctx context.Context, t *testing.T, corrupt, noDevice []string, syncedEarly bool) {
	skipDevice := map[podvol.UniqueVolumeName]bool{}
	for _, n := range noDevice {
		skipDevice[volName(n)] = true
	}
	for _, name := range s.asw.VolumeNames() {
		v, _ := s.asw.Volume(name)
		if v.Spec.Plugin != "" {
			continue // an image volume leaves nothing on disk
		}
		for uid, pm := range v.Pods {
			if !pm.MayBeMounted() {
				continue
			}
			dir, err := ondisk.PodVolumeDir(s.root, uid, v.Spec.PVName)
			if err != nil {
				t.Fatal(err)
			}
			writeVolData(t, dir, fmt.Sprintf(`{"specVolID":%q,"volumeHandle":%q,"driverName":%q,"seLinuxMountContext":%q}`,
				v.Spec.PVName, v.Spec.VolumeHandle, v.Spec.Driver, pm.Volume.SELinuxLabel))
		}
		if v.DeviceState.MayBeMounted() && !skipDevice[name] {
			dir, err := ondisk.StagingDir(s.root, v.Spec.Driver, v.Spec.VolumeHandle)
			if err != nil {
				t.Fatal(err)
			}
			writeVolData(t, dir, fmt.Sprintf(`{"specVolID":%q,"volumeHandle":%q,"driverName":%q,"seLinuxMountContext":%q}`,
				v.Spec.PVName, v.Spec.VolumeHandle, v.Spec.Driver, v.SELinuxContext))
		}
	}
	for _, c := range corrupt { // pod/claim
		pod, claim, _ := strings.Cut(c, "/")
		dir, _ := ondisk.PodVolumeDir(s.root, types.UID("uid-"+pod), "pv-"+claim)
		writeVolData(t, dir, "{")
	}
	s.in = reconciler.NewInbox() // the new process has heard nothing yet
	s.newLoop()
	if syncedEarly {
		s.in.MarkPodsSynced() // before reconstruction has ended
	}
	s.l.Install(reconstruct(ctx, s.root, recovery{}))
	s.out = append(s.out, "restarted; found on disk:")
	s.out = append(s.out, s.state())
}

func writeVolData(t *testing.T, dir, content string) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ondisk.VolumeDataFile), []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

// state prints the actual state, each volume's pods that want it, and
// why what is due waits.
func (s *scenario) state() string {
	names := s.asw.VolumeNames()
	for _, n := range s.dsw.VolumeNames() {
		if _, ok := s.asw.Volume(n); !ok {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	var b strings.Builder
	for _, n := range names {
		v, known := s.asw.Volume(n)
		fmt.Fprintf(&b, "%s:", short(n))
		if known {
			fmt.Fprintf(&b, " attached=%v device=%s", v.Attached, v.DeviceState)
			if v.SELinuxContext != "" {
				fmt.Fprintf(&b, " context=%q", v.SELinuxContext)
			}
			if v.SelfAttached {
				b.WriteString(" va=created")
			}
			uids := make([]string, 0, len(v.Pods))
			for uid, pm := range v.Pods {
				st := pm.State.String()
				if pm.Busy {
					st += "+busy"
				}
				uids = append(uids, string(uid)+"="+st)
			}
			sort.Strings(uids)
			if len(uids) > 0 {
				fmt.Fprintf(&b, " pods=%s", strings.Join(uids, ","))
			}
		} else {
			b.WriteString(" nothing done")
		}
		if _, desired, ok := s.dsw.Volume(n); ok {
			var want []string
			for _, p := range desired {
				want = append(want, p.Pod.Name)
			}
			fmt.Fprintf(&b, " wanted-by=%s", strings.Join(want, ","))
		}
		b.WriteString("\n")
		for _, w := range s.l.WaitingOf(n) {
			fmt.Fprintf(&b, "  waiting: %s\n", w)
		}
	}
	if dirs := s.l.Unreadable(); len(dirs) > 0 {
		fmt.Fprintf(&b, "unreadable: %s\n", strings.Join(dirs, " "))
	}
	if b.Len() == 0 {
		return "empty"
	}
	return strings.TrimRight(b.String(), "\n")
}
