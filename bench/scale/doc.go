// Package scale measures how the example node agent (examples/nodeagent)
// in its default mode grows with the cluster around its node rather
// than with the node's own pods: BenchmarkClusterSize runs the agent as a
// process with its node's client certificate against testenv's
// kube-apiserver (Node authorizer, NodeRestriction), gives it a fixed set
// of pods, and reads its heap, its VmRSS and the API requests it made
// with 0 or many other PersistentVolumes and bound claims in the cluster.
// make bench-scale runs it; the package has no code outside its tests.
package scale
