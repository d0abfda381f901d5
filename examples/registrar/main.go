// Command registrar announces a CSI driver to a node agent built on nodevol
// (or to the kubelet) through the plugin registration directory, as
// node-driver-registrar does: it serves the pluginregistration/v1
// Registration service on {reg-path}/{driver-name}-reg.sock until it gets
// SIGINT or SIGTERM, then removes the socket.
//
//	registrar --reg-path /var/lib/kubelet/plugins_registry \
//	    --driver-name loop.csi.nodevol.io \
//	    --endpoint /var/lib/kubelet/plugins/loop.csi.nodevol.io/csi.sock
package main

import (
	"os"

	"github.com/nodevol/nodevol/examples/registrar/sidecar"
)

func main() { os.Exit(sidecar.Main(os.Args[1:])) }
