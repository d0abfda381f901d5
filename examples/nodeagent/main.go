// Command nodeagent is a node agent built on nodevol: it mounts the CSI
// volumes of the pods bound to its node and unmounts them when the pods go.
// deploy/ runs it as a DaemonSet; docs/OPERATIONS.md tells how.
//
//	nodeagent --kubeconfig ~/.kube/config --node node-1   # drivers register through /var/lib/kubelet/plugins_registry
//	nodeagent --kubeconfig ~/.kube/config --node node-1 --plugin-registration=false --driver loop.csi.nodevol.io=/run/csi/loop.sock
//	nodeagent --http-endpoint :8080   # in a pod: in-cluster config, the node from $NODE_NAME, /metrics and /healthz
//
// The demo (a fake API server, the loop driver, a few pods) is a separate
// command, examples/nodeagent/demo, so that this binary links neither.
package main

import (
	"os"

	"github.com/nodevol/nodevol/examples/nodeagent/internal/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }
