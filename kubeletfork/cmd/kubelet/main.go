// Command kubelet is the kubelet v1.37.2 with nodevol as its volume
// manager: the upstream kubelet, built from k8s.io/kubernetes with the
// patch in ../../patches applied (make kubelet-fork), whose
// NewVolumeManager hook is set to the adapter before the kubelet starts.
// Everything else (flags, configuration file, pod lifecycle, plugin
// registration of device plugins and DRA drivers) is the kubelet's own.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as the kubelet's main
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as the kubelet's main
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as the kubelet's main
	"k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/pkg/kubelet"

	"github.com/nodevol/nodevol/kubeletfork/adapter"
)

func main() {
	kubelet.NewVolumeManager = adapter.New
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
