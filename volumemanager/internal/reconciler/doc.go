// Package reconciler is the volume manager's reconcile loop: it takes the
// world's changes from its inbox, puts the pods they touch into the
// desired state (through internal/resolve), asks the planner what each
// changed volume needs and applies the answer; it is the only writer of
// the actual state.
//
// Loop (loop.go) holds what it keeps of each volume (volumeMemo,
// memo.go) and the queue of volumes to plan; Inbox (inbox.go) is how the
// manager's goroutines post to it. It starts operations (apply.go),
// records their outcomes in the actual state (apply.go), adopts the
// node's own VolumeAttachments at start (adopt.go), and keeps for the
// waits what refused (refusals.go), each pod's last errors
// (poderrors.go), the operations running (running.go) and why a volume
// waits (notes.go; readers in waits.go). It words the pods' events
// (events.go), rate-limits the failure lines (faillog.go) and counts
// what the kubelet counts (metrics.go, selinuxmetrics.go).
//
// It reaches the manager around it through one interface, Host: start
// an operation, hold a pod's objects or an attachment, the in-use hold,
// retake an unreadable directory. It imports resolve, the planner, the
// state and the operation executor; nothing of the volume manager.
package reconciler
