// Package suites names the upstream test suites this module builds and keeps
// what they need in the module's go.mod.
//
// make conformance-bins builds e2e_node.test with go test -c of E2ENode, a
// package of a dependency. Its _test.go files are outside the module's "all"
// (go help packages: tests of dependencies are not in it), so go mod tidy
// would drop the modules only they import and the go.sum lines of the
// modules they load, and go test -c would then fail under the default
// -mod=readonly. e2enode_deps.go imports every package that E2ENode's
// files import, its test files included, behind the "tools" build
// constraint. go mod tidy reads files under every build constraint but
// "ignore", so those packages and all they import are in "all" and tidy
// keeps exactly what the test binary needs. go build, go vet, go test and
// staticcheck never see the file (nothing sets "tools"), so they do not
// type-check the suite's thousands of dependencies, as a _test.go file
// importing them would make go vet do. TestE2ENodeDeps keeps the list equal
// to what E2ENode imports at the required version:
//
//	go test ./suites -run TestE2ENodeDeps -update
//
// rewrites it after k8s.io/kubernetes changes.
package suites

// E2ENode is the import path of Kubernetes' node e2e suite; its
// [NodeConformance] specs judge a kubelet.
const E2ENode = "k8s.io/kubernetes/test/e2e_node"
