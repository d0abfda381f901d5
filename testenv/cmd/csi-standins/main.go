// Command csi-standins plays the parts of two kubernetes-csi sidecars
// whose images the cluster storage suites (e2e.test v1.37.2) deploy and
// that no module proxy serves: node-driver-registrar and livenessprobe. It
// is nodevol's own code, built into images under upstream's names by
// testenv/cmd/storage-suites; which part it plays is the name it runs
// under (os.Args[0], as the images' entrypoints name it):
//
//   - csi-node-driver-registrar: asks the driver at --csi-address its name
//     (GetPluginInfo), announces it to the kubelet on
//     {--plugin-registration-path}/{driver}-reg.sock with the driver's
//     socket at --kubelet-registration-path, as node-driver-registrar does,
//     and serves /healthz on --http-endpoint (ok once the kubelet has
//     registered the driver);
//   - livenessprobe: serves /healthz on --http-endpoint (or :--health-port),
//     ok when the driver at --csi-address answers Probe as ready.
//
// The third, hostpathplugin (the mock CSI driver and the embedded specs'
// proxy), is built from Kubernetes' own mock in the conformance module
// (conformance/cmd/hostpathplugin). Flags the upstream programs have and
// these parts do not need (-v, --timeout, ...) are accepted and ignored.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	part := filepath.Base(os.Args[0])
	var err error
	switch part {
	case "csi-node-driver-registrar":
		err = registrar(ctx, os.Args[1:])
	case "livenessprobe":
		err = livenessProbe(ctx, os.Args[1:])
	default:
		err = fmt.Errorf("run as csi-node-driver-registrar or livenessprobe, not %q", part)
	}
	if err != nil {
		log.Printf("%s: %v", part, err)
		os.Exit(1)
	}
}

// flags is a flag set that takes the named flags and ignores every other
// one upstream's program has (a flag this part does not know is skipped
// with its value, if it has one after "=").
type flags struct {
	*flag.FlagSet
}

func newFlags(name string) flags {
	return flags{flag.NewFlagSet(name, flag.ContinueOnError)}
}

// parse parses the flags this part knows among args and ignores the
// others, which must be given as --name=value or --name.
func (f flags) parse(args []string) error {
	var known []string
	for _, a := range args {
		name := strings.TrimLeft(a, "-")
		name, _, _ = strings.Cut(name, "=")
		if f.Lookup(name) != nil {
			known = append(known, a)
		}
	}
	return f.Parse(known)
}

// dialDriver connects to the CSI driver's unix socket at addr ("/csi/csi.sock"
// or "unix:///csi/csi.sock").
func dialDriver(addr string) (*grpc.ClientConn, error) {
	path := strings.TrimPrefix(addr, "unix://")
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// driverName asks the driver its name, again every second until it answers
// or ctx ends: the driver's container may start after this one.
func driverName(ctx context.Context, conn *grpc.ClientConn) (string, error) {
	id := csi.NewIdentityClient(conn)
	for {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := id.GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName(), nil
		}
		log.Printf("asking the driver its name: %v (again in 1s)", err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// registrar plays node-driver-registrar.
func registrar(ctx context.Context, args []string) error {
	f := newFlags("csi-node-driver-registrar")
	csiAddress := f.String("csi-address", "/run/csi/socket", "the driver's socket in this container")
	kubeletPath := f.String("kubelet-registration-path", "", "the driver's socket on the node, as the kubelet reaches it (required)")
	regDir := f.String("plugin-registration-path", "/registration", "the kubelet's plugin registration directory in this container")
	httpEndpoint := f.String("http-endpoint", "", "address of /healthz")
	if err := f.parse(args); err != nil {
		return err
	}
	if *kubeletPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	conn, err := dialDriver(*csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	name, err := driverName(ctx, conn)
	if err != nil {
		return err
	}
	r, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: *regDir, DriverName: name, Endpoint: *kubeletPath})
	if err != nil {
		return err
	}
	defer r.Stop()
	log.Printf("announcing driver %s at %s on %s", name, *kubeletPath, r.SocketPath())
	var registered atomic.Bool
	if *httpEndpoint != "" {
		stopHealth, err := serveHealth(*httpEndpoint, func(context.Context) error {
			if !registered.Load() {
				return errors.New("the kubelet has not registered the driver")
			}
			if _, err := os.Stat(r.SocketPath()); err != nil {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		defer stopHealth()
	}
	for n := 1; ; n++ {
		s, err := r.WaitForStatus(ctx, n)
		if err != nil {
			return nil // ctx ended: stop, removing the socket
		}
		registered.Store(s.Registered)
		if s.Registered {
			log.Printf("the kubelet registered driver %s", name)
		} else {
			log.Printf("the kubelet refused driver %s: %s", name, s.Error)
		}
	}
}

// livenessProbe plays livenessprobe.
func livenessProbe(ctx context.Context, args []string) error {
	f := newFlags("livenessprobe")
	csiAddress := f.String("csi-address", "/run/csi/socket", "the driver's socket in this container")
	httpEndpoint := f.String("http-endpoint", "", "address of /healthz (default :{health-port})")
	port := f.Int("health-port", 9808, "port of /healthz when --http-endpoint is not given")
	if err := f.parse(args); err != nil {
		return err
	}
	if *httpEndpoint == "" {
		*httpEndpoint = fmt.Sprintf(":%d", *port)
	}
	conn, err := dialDriver(*csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	stopHealth, err := serveHealth(*httpEndpoint, func(ctx context.Context) error {
		resp, err := id.Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			return err
		}
		if r := resp.GetReady(); r != nil && !r.GetValue() {
			return errors.New("the driver is not ready")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer stopHealth()
	<-ctx.Done()
	return nil
}

// serveHealth serves /healthz on addr: 200 when check passes, 500 with its
// error otherwise.
func serveHealth(addr string, check func(context.Context) error) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving /healthz: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := check(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() { _ = srv.Close() }, nil
}
