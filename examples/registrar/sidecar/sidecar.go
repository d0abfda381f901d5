// Package sidecar is the registrar program (examples/registrar) as a
// library, so that other programs and tests can run it as a separate
// process of their own binary, as the demo node agent does.
package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// Main parses args (flags without the program name), serves plugin
// registration until SIGINT or SIGTERM and returns the exit code.
func Main(args []string) int {
	fs := flag.NewFlagSet("registrar", flag.ContinueOnError)
	regPath := fs.String("reg-path", "/var/lib/kubelet/plugins_registry", "plugin registration directory")
	driver := fs.String("driver-name", "", "CSI driver name sent in GetInfo (required)")
	endpoint := fs.String("endpoint", "", "CSI driver socket sent in GetInfo (required)")
	versions := fs.String("versions", "1.0.0", "comma-separated supported CSI versions")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *regPath, *driver, *endpoint, strings.Split(*versions, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "registrar:", err)
		return 1
	}
	return 0
}

// run serves GetInfo for driver at endpoint on
// {regPath}/{driver}-reg.sock, logging each registration status it is
// told, until ctx ends; then it removes the socket.
func run(ctx context.Context, regPath, driver, endpoint string, versions []string) error {
	if driver == "" || endpoint == "" {
		return errors.New("--driver-name and --endpoint are required")
	}
	if err := os.MkdirAll(regPath, 0o750); err != nil {
		return err
	}
	r, err := csitest.StartRegistrar(csitest.RegistrarConfig{
		Dir:        regPath,
		DriverName: driver,
		Endpoint:   endpoint,
		Versions:   versions,
	})
	if err != nil {
		return err
	}
	defer r.Stop()
	logger := klog.FromContext(ctx).WithValues("socketPath", r.SocketPath(), "driver", driver)
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
