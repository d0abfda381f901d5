package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

// TestKnownFlags keeps the stand-in's flags, with a value given either
// way, and drops hostpathplugin's others.
func TestKnownFlags(t *testing.T) {
	o, err := parse([]string{"--drivername=csi-mock-x", "--nodeid=n", "--endpoint=/csi/csi.sock", "--statedir=/tmp/d",
		"-v=5", "--enable-attach", "--attach-limit", "2", "--node-expand-required=true", "--capacity=slow=1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	want := options{driverName: "csi-mock-x", nodeID: "n", endpoint: "/csi/csi.sock", enableAttach: true, nodeExpand: true, attachLimit: 2}
	if o != want {
		t.Errorf("options %+v, want %+v", o, want)
	}
}

// TestRefusesHostpathDriver: with neither --proxy-endpoint nor a driver
// name it refuses, rather than pretend to be the CSI hostpath driver.
func TestRefusesHostpathDriver(t *testing.T) {
	dir := shortDir(t)
	if err := run(t.Context(), []string{"--endpoint=unix://" + filepath.Join(dir, "csi.sock")}); err == nil {
		t.Fatal("no driver name and no proxy: ran")
	}
}

// TestSplice: each client connection on the unix socket is paired with
// the next connection on the port, in order, both ways, as the e2e
// suite's proxy expects (it connects to the port ahead of any client).
func TestSplice(t *testing.T) {
	dir := shortDir(t)
	clients, err := net.Listen("unix", filepath.Join(dir, "csi.sock"))
	if err != nil {
		t.Fatal(err)
	}
	driver, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- splice(ctx, clients, driver) }()

	var remotes []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", driver.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		remotes = append(remotes, c)
	}
	for i, remote := range remotes {
		client, err := net.Dial("unix", filepath.Join(dir, "csi.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		fmt.Fprintf(client, "ping %d\n", i)
		got, err := bufio.NewReader(remote).ReadString('\n')
		if err != nil || got != fmt.Sprintf("ping %d\n", i) {
			t.Fatalf("pair %d: the driver's side read %q (%v)", i, got, err)
		}
		fmt.Fprintf(remote, "pong %d\n", i)
		got, err = bufio.NewReader(client).ReadString('\n')
		if err != nil || got != fmt.Sprintf("pong %d\n", i) {
			t.Fatalf("pair %d: the client read %q (%v)", i, got, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("splice after ctx ended: %v", err)
	}
	if _, err := io.ReadAll(remotes[1]); err != nil {
		t.Errorf("a pair after ctx ended: %v, want it closed", err)
	}
}

// shortDir is a directory under /tmp for a unix socket (t.TempDir's path
// may be too long for one), removed when t ends.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "hp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestMockDriver: as the mock driver it answers on the endpoint with its
// name and logs the call in the form the specs read from its log.
func TestMockDriver(t *testing.T) {
	var logs syncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer klog.LogToStderr(true)
	sock := filepath.Join(shortDir(t), "csi.sock")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--drivername=csi-mock-e2e", "--endpoint=" + sock, "-v=5"}) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var info *csi.GetPluginInfoResponse
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err = csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || info.GetName() != "csi-mock-e2e" {
		t.Fatalf("GetPluginInfo: %v, %v; want the name csi-mock-e2e", info, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if want := `gRPCCall: {"Method":"/csi.v1.Identity/GetPluginInfo"`; !strings.Contains(logs.String(), want) {
		t.Errorf("the log has no %q:\n%s", want, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for klog's writes and the test's read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
