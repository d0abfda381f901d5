// Package resolve turns the pods added to the volume manager into the
// volumes they want (state.DesiredVolume), reading what that needs.
//
// A Resolver finds each pod volume's plugin and resolves its source: a
// claim to its bound PersistentVolume (node affinity checked against this
// node's Node, node.go), a generic ephemeral volume to its claim, an inline
// CSI volume, an in-tree volume through CSI migration (migration.go), a
// volume of another plugin to that plugin's spec, and the SELinux context
// each pod mounts it with (selinux.go). A Table records, for the reconcile
// loop, how far each added pod got: why it is not resolved, the claims it
// waits for and since when, the reads of the object cache it waits for.
//
// Around it: what is kept of a pod between its add and its resolution
// (KeptPod, podtrim.go), the trimming of the objects the informers and
// the object cache keep (transform.go, intern.go), and the object cache's
// holds and listers that read claims, volumes and attachments one at a
// time (holds.go, objects.go).
//
// It imports the planner for its error marks and the state for the desired
// volume; nothing of the volume manager around it.
package resolve
