// Package planner decides, for one volume at a time, what the volume
// manager does next, from a view of that volume, without any I/O.
//
// Plan is the only entry point the reconcile loop uses: it reads a View
// (what pods want, what is done, what runs, what waits and why, and the
// facts the loop gathered) and returns a Decision (the operations to
// start, the state to adopt, the backoff to forget, the pods refused and
// why, the node's size of the volume to record). The admission rules it
// applies (ReadWriteOncePod, SELinux contexts), the holds of what was found
// on disk or belongs to a pod not resolved, when a node expansion is due
// (NodeExpansionDue and ExpansionTarget, which the expansion checks again
// on the claim read afresh) and the finality of a pod's volume errors live
// here too. The package imports no file system, network or clock:
// imports_test.go keeps it so.
package planner
