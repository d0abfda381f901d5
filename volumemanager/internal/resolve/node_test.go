package resolve

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

func testNode(name string, labels map[string]string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceMemory: resource.MustParse("4Gi")}}}
}

func affinity(terms ...v1.NodeSelectorTerm) *v1.VolumeNodeAffinity {
	return &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: terms}}
}

func expr(key string, op v1.NodeSelectorOperator, values ...string) v1.NodeSelectorRequirement {
	return v1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

// TestCheckNodeAffinity: a PV's required node affinity is matched as the
// kubelet matches it: terms ORed, requirements ANDed, every operator, the
// node's name through matchFields, an empty term matching nothing.
func TestCheckNodeAffinity(t *testing.T) {
	node := testNode("node-1", map[string]string{"kubernetes.io/hostname": "node-1", "zone": "a", "disks": "4"})
	term := func(reqs ...v1.NodeSelectorRequirement) v1.NodeSelectorTerm {
		return v1.NodeSelectorTerm{MatchExpressions: reqs}
	}
	tests := []struct {
		name     string
		affinity *v1.VolumeNodeAffinity
		want     string // "" to match, else a part of the error
	}{
		{"no affinity", nil, ""},
		{"no required", &v1.VolumeNodeAffinity{}, ""},
		{"hostname in", affinity(term(expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-1"))), ""},
		{"another node", affinity(term(expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-2"))), "no matching NodeSelectorTerms for node node-1"},
		{"second term matches", affinity(term(expr("zone", v1.NodeSelectorOpIn, "b")), term(expr("zone", v1.NodeSelectorOpIn, "a"))), ""},
		{"requirements ANDed", affinity(term(expr("zone", v1.NodeSelectorOpIn, "a"), expr("zone", v1.NodeSelectorOpNotIn, "a"))), "no matching"},
		{"exists", affinity(term(expr("disks", v1.NodeSelectorOpExists))), ""},
		{"does not exist", affinity(term(expr("gpu", v1.NodeSelectorOpDoesNotExist))), ""},
		{"gt", affinity(term(expr("disks", v1.NodeSelectorOpGt, "3"))), ""},
		{"lt", affinity(term(expr("disks", v1.NodeSelectorOpLt, "3"))), "no matching"},
		{"name by matchFields", affinity(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{expr("metadata.name", v1.NodeSelectorOpIn, "node-1")}}), ""},
		{"another name by matchFields", affinity(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{expr("metadata.name", v1.NodeSelectorOpIn, "node-2")}}), "no matching"},
		{"empty term", affinity(v1.NodeSelectorTerm{}), "no matching"},
		{"no terms", affinity(), "no matching"},
		{"bad operator", affinity(term(expr("zone", "Near", "a"))), `unknown operator "Near"`},
		{"gt without a number", affinity(term(expr("disks", v1.NodeSelectorOpGt, "many"))), `key "disks"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: v1.PersistentVolumeSpec{NodeAffinity: tt.affinity}}
			err := checkNodeAffinity(pv, node)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "PV pv-1")) {
				t.Errorf("checkNodeAffinity = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestResolvePVOfEachKind: a claim resolves to the plugin of its PV's
// kind, named as the kubelet names it (node-scoped for a plugin that
// stages, pod-scoped otherwise), after the PV's node affinity is checked
// against this node; a PV no plugin handles is final, a node that does not
// match or is not known yet is not.
func TestResolvePVOfEachKind(t *testing.T) {
	here := affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-1")}})
	there := affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-2")}})
	pv := func(name string, src v1.PersistentVolumeSource, aff *v1.VolumeNodeAffinity, claim *v1.PersistentVolumeClaim) *v1.PersistentVolume {
		return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: src, NodeAffinity: aff, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			ClaimRef: &v1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}}}
	}
	local := v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/disks/d1"}}
	tests := []struct {
		name      string
		src       v1.PersistentVolumeSource
		aff       *v1.VolumeNodeAffinity
		node      *v1.Node
		wantName  string
		ephemeral bool
		err       string
		final     bool
	}{
		{name: "local", src: local, aff: here, node: testNode("node-1", map[string]string{"kubernetes.io/hostname": "node-1"}),
			wantName: "kubernetes.io/local-volume/pv-1"},
		{name: "hostPath", src: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/srv/data"}},
			wantName: "kubernetes.io/host-path/uid-1-pv-1", ephemeral: true},
		{name: "local of another node", src: local, aff: there, node: testNode("node-1", map[string]string{"kubernetes.io/hostname": "node-1"}),
			err: "PV pv-1: node affinity: no matching NodeSelectorTerms for node node-1"},
		{name: "node not known", src: local, aff: here, err: "PV pv-1: node affinity: this node's Node object is not known yet"},
		{name: "iscsi", src: v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "t", IQN: "i"}},
			err: "PV pv-1 of kind iscsi: no volume plugin handles it", final: true},
		{name: "hostPath with ..", src: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/srv/../etc"}},
			err: "..", final: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := boundClaim("ns", "c", "pv-1")
			r := testResolver(t, claim, pv("pv-1", tt.src, tt.aff, claim))
			r.Node = func() (*v1.Node, error) {
				if tt.node == nil {
					return nil, errNoNode
				}
				return tt.node, nil
			}
			pod := podWithVolumes("uid-1", "ns", v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}})
			_, _, resolved, errs := r.ResolvePod(pod)
			if tt.err != "" {
				err := errs["data"]
				if err == nil || !strings.Contains(err.Error(), tt.err) || errors.Is(err, planner.ErrUnknownSource) != tt.final {
					t.Fatalf("error = %v, want %q (final %v)", err, tt.err, tt.final)
				}
				return
			}
			if len(resolved) != 1 || len(errs) != 0 {
				t.Fatalf("resolved %+v, errors %v", resolved, errs)
			}
			spec := resolved[0].Spec
			if spec.Name != podvol.UniqueVolumeName(tt.wantName) || spec.Ephemeral != tt.ephemeral || spec.PVName != "pv-1" || spec.PVSource == nil || spec.Claim != "ns/c" {
				t.Errorf("spec = %+v, want name %s, ephemeral %v, with the PV's name, source and claim", spec, tt.wantName, tt.ephemeral)
			}
		})
	}
}

// TestNodeFallsBackToMachine: the memory bound of a tmpfs and the node's
// allocatable resources wait (ErrNotReady's errNoNode) while the Node
// informer has not synced, and once it has synced without the Node fall
// back to the machine's, as the kubelet's getNodeAnyWay falls back to the
// node it builds from the machine.
func TestNodeFallsBackToMachine(t *testing.T) {
	f, get, err := NodeInformer(fake.NewClientset(), node, func() {}, func(...podvol.UniqueVolumeName) {})
	if err != nil {
		t.Fatal(err)
	}
	mem, alloc := AllocatableMemory(get), NodeAllocatable(get)
	if _, err := mem(); !errors.Is(err, errNoNode) || errors.Is(err, errNodeMissing) {
		t.Fatalf("before the informer synced: %v, want errNoNode alone", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	want, err := machineMemory()
	if err != nil || want <= 0 {
		t.Fatalf("machineMemory: %d, %v", want, err)
	}
	if got, err := mem(); err != nil || got != want {
		t.Errorf("no Node: memory %d, %v; want the machine's %d", got, err, want)
	}
	if l, err := alloc(); err != nil || l.Memory().Value() != want || l.Cpu().Value() != int64(runtime.NumCPU()) {
		t.Errorf("no Node: allocatable %v, %v; want the machine's", l, err)
	}
}

// TestNodeNotListedIsAWait: a volume that needs this node's Node object
// while the Node informer has not made its first list waits as the pods
// wait for the other informers' lists: the pod is held, and the wait is
// logged without an error (a start that logged errors for it failed the
// hand-over tests now and then); once the informer has listed, a Node
// still unknown is logged with its error.
func TestNodeNotListedIsAWait(t *testing.T) {
	here := affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{expr("kubernetes.io/hostname", v1.NodeSelectorOpIn, "node-1")}})
	claim := boundClaim("ns", "c", "pv-1")
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/disks/d1"}}, NodeAffinity: here,
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		ClaimRef:    &v1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}}}
	pod := podWithVolumes("uid-1", "ns", v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}})
	for _, tt := range []struct {
		name    string
		err     error
		wantErr bool
	}{
		{"not listed yet", fmt.Errorf("%w: %w: not found", errNoNode, errNodeNotListed), false},
		{"listed, not readable", fmt.Errorf("%w: forbidden", errNoNode), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := testResolver(t, claim, pv)
			r.Node = func() (*v1.Node, error) { return nil, tt.err }
			var logged []string
			logger := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{Verbosity: 10})
			tbl := NewTable(r, clock.RealClock{})
			_, _, resolved, errs := tbl.Resolve(pod, logger)
			if len(resolved) != 0 || !errors.Is(errs["data"], errNoNode) || tbl.Hold(pod.UID) == "" {
				t.Fatalf("resolved %v, errors %v, hold %q: want the pod held on the Node", resolved, errs, tbl.Hold(pod.UID))
			}
			withErr := slices.ContainsFunc(logged, func(l string) bool { return strings.Contains(l, `"err"=`) })
			if withErr != tt.wantErr {
				t.Errorf("logged %q: an error logged = %v, want %v", logged, withErr, tt.wantErr)
			}
		})
	}
}
