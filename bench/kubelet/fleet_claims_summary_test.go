package kubeletbench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// fleetClaimFigures are the figures of a run with claims (-fleet.claims)
// about its claims' requests only (fleetClaimResources), in the summary's
// order after fleetFigures; "/claim" is per claim, one a pod.
var fleetClaimFigures = []struct{ key, what string }{
	{"boot-claim-req/node", "boot: claim requests (pvc, pv, va, csidriver) per node"},
	{"start-claim-req/node", "start: claim requests (pvc, pv, va, csidriver) per node"},
	{"start-claim-req/claim", "start: claim requests (pvc, pv, va, csidriver) per claim"},
	{"rest-claim-req/node/h", "rest: claim requests (pvc, pv, va, csidriver) per node per hour"},
	{"rest-claim-get/claim/min", "rest: claim GETs per claim per minute"},
	{"churn-claim-req/node", "churn: claim requests (pvc, pv, va, csidriver) per node"},
	{"delete-claim-req/node", "delete: claim requests (pvc, pv, va, csidriver) per node"},
}

// claimPhase records, for a run with claims, phase name's claim requests
// per node (rest's per hour, and its GETs per claim per minute) from the
// nodes' counts over d.
func (r *fleetResult) claimPhase(name string, d time.Duration, counts nodeCounts) {
	if !r.Claims {
		return
	}
	var claims, gets float64
	for _, c := range counts {
		for k, v := range c {
			verb, res, _ := strings.Cut(k, " ")
			if slices.Contains(fleetClaimResources, res) {
				claims += float64(v)
				if verb == "get" {
					gets += float64(v)
				}
			}
		}
	}
	n, pods := float64(r.Nodes), float64(r.Pods)
	if name != "rest" {
		r.Figures[name+"-claim-req/node"] = claims / n
		if name == "start" {
			r.Figures["start-claim-req/claim"] = claims / n / pods
		}
		return
	}
	perHour := float64(time.Hour) / float64(d)
	r.Figures["rest-claim-req/node/h"] = claims / n * perHour
	r.Figures["rest-claim-get/claim/min"] = gets / n / pods * perHour / 60
}

// claimsSuffix marks a run with claims in its file's name.
func (r *fleetResult) claimsSuffix() string {
	if r.Claims {
		return "-claims"
	}
	return ""
}

// claimsTitle marks a shape with claims in its heading.
func (sh fleetShape) claimsTitle() string {
	if sh.claims {
		return ", a CSI claim each pod"
	}
	return ""
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// claimRows are the summary's rows of fleetClaimFigures, for a shape with
// claims only (a shape without has none: its table is unchanged).
func claimRows(sh fleetShape, kubelet, fork map[int]*fleetResult) string {
	if !sh.claims {
		return ""
	}
	var sb strings.Builder
	for _, f := range fleetClaimFigures {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", f.what, figureRange(kubelet, f.key), figureRange(fork, f.key), ratioRange(kubelet, fork, f.key))
	}
	return sb.String()
}
