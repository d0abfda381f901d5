// Package noderun is what the runners of upstream's suites on a real node
// (testenv/cmd/node-conformance, testenv/cmd/storage-suites) share: the
// run's own namespaces, the kubelet's root and containerd's run directory
// inside them, the node's registry, the images the suites run (built
// here under upstream's names, SuiteImages) and the clean-up that leaves
// nothing behind.
package noderun
