package planner

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// foundHeld is why what was found on disk at start is kept.
const foundHeld = "found on disk at start; kept until every pod added before MarkPodsSynced has been resolved"

// podHold says why pod uid's mount of the volume must not be torn down
// although no desired pod is that pod, or "": the pod is added but cannot
// be resolved (yet), or its mount was found on disk at start and the pods
// are not synced while that pod was never added.
func podHold(v View, uid types.UID) string {
	f := v.Pods[uid]
	switch {
	case f.Unresolved != "":
		return f.Unresolved
	case f.Found && !f.Added && !v.PodsSynced:
		return foundHeld
	}
	return ""
}

// deviceHold says why the device must not be unstaged (nor its
// self-made attachment deleted), or "": it was found on disk at start and
// the pods are not synced, or a pod volume directory that could not be
// read may use it.
func deviceHold(v View) string {
	switch {
	case !v.PodsSynced && v.FoundDevice:
		return foundHeld
	case v.Unreadable != "":
		return fmt.Sprintf("pod volume directory %s could not be read and may use it", v.Unreadable)
	}
	return ""
}
