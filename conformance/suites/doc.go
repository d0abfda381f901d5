// Package suites names the upstream test suites this module builds and keeps
// what they need in the module's go.mod.
//
// make conformance-bins builds e2e_node.test with go test -c of k8s.io/kubernetes/test/e2e_node,
// and make storage-suites-bins e2e.test of k8s.io/kubernetes/test/e2e: packages of a dependency,
// whose _test.go files are outside the module's "all" (go help packages:
// tests of dependencies are not in it), so go mod tidy would drop the
// modules only they import and the go.sum lines of the modules they load,
// and go test -c would then fail under the default -mod=readonly.
// e2enode_deps.go (e2e_deps.go) imports every package that e2e_node's
// (e2e's) files import, their test files included, behind the "tools"
// build constraint. go mod tidy reads files under every build constraint
// but "ignore", so those packages and all they import are in "all" and
// tidy keeps exactly what the test binaries need. go build, go vet, go
// test and staticcheck never see the files (nothing sets "tools"), so they
// do not type-check the suites' thousands of dependencies, as a _test.go
// file importing them would make go vet do. TestSuiteDeps keeps each list
// equal to what its suite imports at the required version:
//
//	go test ./suites -run TestSuiteDeps -update
//
// rewrites them after k8s.io/kubernetes changes.
package suites

// e2eNode is the import path of Kubernetes' node e2e suite; its
// [NodeConformance] specs judge a kubelet.
const e2eNode = "k8s.io/kubernetes/test/e2e_node"

// e2e is the import path of Kubernetes' cluster e2e suite; its
// [sig-storage] testsuites judge a node's volumes through a cluster.
const e2e = "k8s.io/kubernetes/test/e2e"
