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
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

func main() {
	regPath := flag.String("reg-path", "/var/lib/kubelet/plugins_registry", "plugin registration directory")
	driver := flag.String("driver-name", "", "CSI driver name sent in GetInfo (required)")
	endpoint := flag.String("endpoint", "", "CSI driver socket sent in GetInfo (required)")
	versions := flag.String("versions", "1.0.0", "comma-separated supported CSI versions")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*regPath, *driver, *endpoint, *versions); err != nil {
		fmt.Fprintln(os.Stderr, "registrar:", err)
		os.Exit(1)
	}
}

func run(regPath, driver, endpoint, versions string) error {
	if driver == "" || endpoint == "" {
		return fmt.Errorf("--driver-name and --endpoint are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(regPath, 0o750); err != nil {
		return err
	}
	r, err := csitest.StartRegistrar(csitest.RegistrarConfig{
		Dir:        regPath,
		DriverName: driver,
		Endpoint:   endpoint,
		Versions:   strings.Split(versions, ","),
	})
	if err != nil {
		return err
	}
	defer r.Stop()
	logger := klog.Background().WithValues("socketPath", r.SocketPath(), "driver", driver)
	logger.Info("Serving plugin registration")
	for n := 1; ; n++ {
		s, err := r.WaitForStatus(ctx, n)
		if err != nil {
			logger.Info("Stopping")
			return nil
		}
		if s.Registered {
			logger.Info("Plugin registered")
		} else {
			logger.Info("Plugin registration failed", "error", s.Error)
		}
	}
}
