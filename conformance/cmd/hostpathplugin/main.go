// Command hostpathplugin plays, for the cluster storage suites' CSI mock
// specs, the image registry.k8s.io/sig-storage/hostpathplugin:v1.17.1
// (csi-driver-host-path, which no module proxy serves) in the two ways
// those specs deploy it (test/e2e/testing-manifests/storage-csi/mock):
//
//   - as the mock CSI driver (csi-mock-driver.yaml: --drivername, --nodeid,
//     --endpoint and the mock's switches --enable-attach,
//     --enable-topology, --attach-limit, --node-expand-required): it
//     serves Kubernetes' own mock CSI driver, the one e2e.test runs
//     in-process for its embedded specs (test/e2e/storage/drivers/csi-test,
//     v1.37.2), on the endpoint, its directories made on the node's file
//     system, and logs every call as "gRPCCall: {json}" (at -v=3 and
//     above), the lines the specs read from the container's log;
//   - as the proxy of the embedded specs (csi-mock-proxy.yaml,
//     --proxy-endpoint=tcp://:PORT): for each connection a client makes to
//     the unix socket at --endpoint it takes one connection on PORT, where
//     e2e.test connects through a port forward, and copies both ways (the
//     suite's proxy package expects socat's "UNIX-LISTEN:...,fork
//     TCP-LISTEN:PORT,reuseport").
//
// It is not the CSI hostpath driver: started without either, for the
// csi-hostpath driver's manifests, it refuses. Other flags of
// hostpathplugin are accepted and ignored.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	mockdriver "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	mockservice "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		klog.ErrorS(err, "hostpathplugin")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// options are the flags this stand-in takes.
type options struct {
	driverName, nodeID, endpoint, proxyEndpoint string
	enableAttach, enableTopology, nodeExpand    bool
	attachLimit                                 int64
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("hostpathplugin", flag.ContinueOnError)
	fs.StringVar(&o.driverName, "drivername", "", "the driver's name")
	fs.StringVar(&o.nodeID, "nodeid", "", "the node's ID (the mock answers with the driver's name, as it does embedded)")
	fs.StringVar(&o.endpoint, "endpoint", "unix:///csi/csi.sock", "the unix socket to serve on")
	fs.StringVar(&o.proxyEndpoint, "proxy-endpoint", "", "tcp://:PORT: run as the embedded specs' proxy")
	fs.BoolVar(&o.enableAttach, "enable-attach", false, "the mock needs ControllerPublish")
	fs.BoolVar(&o.enableTopology, "enable-topology", false, "the mock reports a topology")
	fs.BoolVar(&o.nodeExpand, "node-expand-required", false, "the mock needs NodeExpandVolume")
	fs.Int64Var(&o.attachLimit, "attach-limit", 0, "the mock's volumes per node")
	klog.InitFlags(fs)
	if err := fs.Parse(known(fs, args)); err != nil {
		return o, err
	}
	return o, nil
}

// known keeps the flags fs defines, with their values ("--name=value",
// or "--name value" for a flag that is not a bool), and drops every other
// flag upstream's hostpathplugin has.
func known(fs *flag.FlagSet, args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		out = append(out, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	sock := strings.TrimPrefix(o.endpoint, "unix://")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		return err
	}
	if o.proxyEndpoint != "" {
		tcpAddr, ok := strings.CutPrefix(o.proxyEndpoint, "tcp://")
		if !ok {
			return fmt.Errorf("--proxy-endpoint %q: want tcp://:PORT", o.proxyEndpoint)
		}
		clients, err := net.Listen("unix", sock)
		if err != nil {
			return err
		}
		driver, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			clients.Close()
			return err
		}
		klog.InfoS("Proxying", "socket", sock, "port", driver.Addr().String())
		return splice(ctx, clients, driver)
	}
	if o.driverName == "" {
		return errors.New("--drivername is required; without --proxy-endpoint this plays the mock CSI driver only, not the CSI hostpath driver")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	s := mockservice.New(mockservice.Config{
		DriverName:            o.driverName,
		DisableAttach:         !o.enableAttach,
		EnableTopology:        o.enableTopology,
		NodeExpansionRequired: o.nodeExpand,
		AttachLimit:           o.attachLimit,
	})
	d := mockdriver.NewCSIDriver(&mockdriver.CSIDriverServers{Controller: s, Identity: s, Node: s})
	if err := d.Start(l, nil); err != nil {
		return err
	}
	klog.InfoS("Serving the mock CSI driver", "driver", o.driverName, "socket", sock)
	<-ctx.Done()
	d.Stop()
	return nil
}

// splice pairs each connection accepted on clients with the next one
// accepted on driver, in order, and copies both ways until either side
// closes; it returns when ctx ends, closing both listeners and every
// pair.
func splice(ctx context.Context, clients, driver net.Listener) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	// track keeps the open connections for the close at ctx's end; one
	// accepted as ctx ends is closed at once.
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case add && ctx.Err() != nil:
			c.Close()
		case add:
			open[c] = true
		default:
			delete(open, c)
		}
	}
	go func() {
		<-ctx.Done()
		clients.Close()
		driver.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		client, err := clients.Accept()
		if err != nil {
			break
		}
		track(client, true)
		remote, err := driver.Accept()
		if err != nil {
			client.Close()
			break
		}
		track(remote, true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipe(client, remote)
			track(client, false)
			track(remote, false)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("a listener closed")
}

// pipe copies a to b and b to a until one side ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}
