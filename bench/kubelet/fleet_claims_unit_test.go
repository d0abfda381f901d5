package kubeletbench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
)

func TestFleetClaimObjects(t *testing.T) {
	name := fleetObjName("fleet-001", 7)
	pvc := fleetClaim(name)
	if pvc.Name != name || pvc.Namespace != objNS || pvc.Spec.VolumeName != "pv-"+name || *pvc.Spec.StorageClassName != "" {
		t.Errorf("claim %s/%s of PV %s, class %q", pvc.Namespace, pvc.Name, pvc.Spec.VolumeName, *pvc.Spec.StorageClassName)
	}
	pv := fleetClaimPV("fleet-001", name, types.UID("uid-1"), "vol-1")
	if pv.Name != pvc.Spec.VolumeName {
		t.Errorf("PV %s, the claim asks for %s", pv.Name, pvc.Spec.VolumeName)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != objNS || ref.Name != name || ref.UID != "uid-1" {
		t.Errorf("the PV's claimRef %+v", ref)
	}
	if csi := pv.Spec.CSI; csi == nil || csi.Driver != fleetDriverName || csi.VolumeHandle != "vol-1" {
		t.Errorf("the PV's CSI source %+v", csi)
	}
	if pv.Spec.Capacity.Storage().Cmp(pvc.Spec.Resources.Requests[v1.ResourceStorage]) != 0 {
		t.Errorf("the PV holds %v, the claim asks for %v", pv.Spec.Capacity.Storage(), pvc.Spec.Resources.Requests.Storage())
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "topology.loop.csi.nodevol.io/node" ||
		len(terms[0].MatchExpressions[0].Values) != 1 || terms[0].MatchExpressions[0].Values[0] != "fleet-001" {
		t.Errorf("the PV's node affinity %+v: not node fleet-001 by the driver's topology key", terms)
	}
	d := fleetCSIDriver()
	if d.Name != fleetDriverName || d.Spec.AttachRequired == nil || *d.Spec.AttachRequired {
		t.Errorf("the CSIDriver %s requires attach: %v", d.Name, d.Spec.AttachRequired)
	}
}

func TestFleetClaimPod(t *testing.T) {
	// The same claim in every generation, mounted by the container; the
	// pod's other volumes kept.
	for gen := range 2 {
		plain := fleetPod("fleet-000", 3, gen)
		pod := withFleetClaim(fleetPod("fleet-000", 3, gen), "fleet-000", 3)
		if len(pod.Spec.Volumes) != len(plain.Spec.Volumes)+1 {
			t.Fatalf("gen %d: %d volumes, want %d", gen, len(pod.Spec.Volumes), len(plain.Spec.Volumes)+1)
		}
		v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
		if v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "fleet-000-obj-003" {
			t.Errorf("gen %d: the last volume %+v is not the pod's claim", gen, v)
		}
		mounts := pod.Spec.Containers[0].VolumeMounts
		if m := mounts[len(mounts)-1]; m.Name != v.Name {
			t.Errorf("gen %d: the claim is not mounted: %+v", gen, mounts)
		}
	}
}

func TestFleetClaimPhase(t *testing.T) {
	counts := nodeCounts{
		"system:node:a": apiaudit.Counts{"get persistentvolumeclaims": 4, "get persistentvolumes": 4, "watch csidrivers": 1,
			"create serviceaccounts/token": 2, "get csinodes": 1, "get storageclasses": 1},
		"system:node:b": apiaudit.Counts{"get persistentvolumeclaims": 2, "get persistentvolumes": 2, "get volumeattachments": 1},
	}
	r := &fleetResult{Nodes: 2, Pods: 2, Claims: true, Figures: map[string]float64{}, Requests: map[string]map[string]float64{}}
	from := fleetSample{at: time.Unix(0, 0)}
	to := fleetSample{at: from.at.Add(2 * time.Minute)}
	r.phase("start", from, to, counts)
	r.phase("rest", from, to, counts)
	// csinodes, storageclasses and tokens are volume requests, not claim
	// ones.
	for key, want := range map[string]float64{
		"start-claim-req/node":     14.0 / 2,
		"start-claim-req/claim":    14.0 / 2 / 2,
		"start-vol-req/node":       18.0 / 2,
		"rest-claim-req/node/h":    14.0 / 2 * 30,
		"rest-claim-get/claim/min": 13.0 / 2 / 2 / 2,
	} {
		if got := r.Figures[key]; got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
	r.Claims = false
	r.Figures = map[string]float64{}
	r.phase("start", from, to, counts)
	for key := range r.Figures {
		if strings.Contains(key, "claim") {
			t.Errorf("a run without claims has figure %s", key)
		}
	}
}

func TestFleetSummaryClaims(t *testing.T) {
	dir := t.TempDir()
	for _, r := range []*fleetResult{
		{Side: "kubelet", Nodes: 2, Pods: 3, Run: 0, Figures: map[string]float64{"start-vol-req/node": 100}},
		{Side: "kubelet", Nodes: 2, Pods: 3, Run: 0, Claims: true,
			Figures: map[string]float64{"start-vol-req/node": 112, "start-claim-req/node": 12, "rest-claim-get/claim/min": 2}},
		{Side: "fork", Nodes: 2, Pods: 3, Run: 0, Claims: true,
			Figures: map[string]float64{"start-vol-req/node": 106, "start-claim-req/node": 6, "rest-claim-get/claim/min": 2}},
	} {
		if err := r.save(dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nodes-2-pods-3-claims-run-0-kubelet.json")); err != nil {
		t.Errorf("the run with claims is not saved apart: %v", err)
	}
	s, err := loadFleet(dir)
	if err != nil {
		t.Fatal(err)
	}
	md := s.markdown()
	plain, claims, ok := strings.Cut(md, "### 2 nodes, 3 pods each, a CSI claim each pod (runs: kubelet 1, fork 1)\n")
	if !ok {
		t.Fatalf("no shape with claims, after the one without:\n%s", md)
	}
	if !strings.HasPrefix(plain, "### 2 nodes, 3 pods each (runs: kubelet 1, fork 0)\n") || strings.Contains(plain, "claim") {
		t.Errorf("the shape without claims is not as before:\n%s", plain)
	}
	for _, want := range []string{
		"| start: volume requests per node | 112 | 106 | 0.95 |",
		"| start: claim requests (pvc, pv, va, csidriver) per node | 12.0 | 6.00 | 0.50 |",
		"| rest: claim GETs per claim per minute | 2.00 | 2.00 | 1.00 |",
		"| churn: claim requests (pvc, pv, va, csidriver) per node | - | - | - |",
	} {
		if !strings.Contains(claims, want) {
			t.Errorf("the shape with claims lacks %q:\n%s", want, claims)
		}
	}
}
