package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestFlagsIgnoreOthers: a part takes its own flags and skips the ones
// upstream's program has that it does not.
func TestFlagsIgnoreOthers(t *testing.T) {
	f := newFlags("x")
	addr := f.String("csi-address", "", "")
	if err := f.parse([]string{"--v=5", "--csi-address=/csi/csi.sock", "-timeout=1m", "--leader-election"}); err != nil {
		t.Fatal(err)
	}
	if *addr != "/csi/csi.sock" {
		t.Errorf("csi-address %q, want /csi/csi.sock", *addr)
	}
}

// TestRegistrar plays the kubelet against the registrar part: it finds
// the registration socket named after the driver's own name, gets the
// driver's node socket in GetInfo, and /healthz turns ok once the kubelet
// says it registered the driver.
func TestRegistrar(t *testing.T) {
	drv := csitest.New(t, csitest.Options{DriverName: "csi-mock-e2e"})
	regDir := csitest.SocketDir(t)
	health := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- registrar(ctx, []string{"--v=5", "--csi-address=" + drv.Endpoint(),
			"--kubelet-registration-path=/var/lib/kubelet/plugins/csi-mock/csi.sock",
			"--plugin-registration-path=" + regDir, "--http-endpoint=" + health, "--timeout=1m"})
	}()
	sock := filepath.Join(regDir, "csi-mock-e2e-reg.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	var info *registerapi.PluginInfo
	waitFor(t, "GetInfo on "+sock, func() bool {
		info, err = reg.GetInfo(ctx, &registerapi.InfoRequest{})
		return err == nil
	})
	if info.Name != "csi-mock-e2e" || info.Endpoint != "/var/lib/kubelet/plugins/csi-mock/csi.sock" || info.Type != registerapi.CSIPlugin {
		t.Errorf("GetInfo %+v, want the driver's name, its node socket and type CSIPlugin", info)
	}
	// The health server starts right after the registration socket:
	// until the kubelet registers the driver, it answers 500.
	waitFor(t, "/healthz answering 500 before the kubelet registered the driver", func() bool {
		return healthz(t, health) == http.StatusInternalServerError
	})
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/healthz ok", func() bool { return healthz(t, health) == http.StatusOK })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the registrar after ctx ended: %v", err)
	}
}

// TestLivenessProbe: /healthz is ok while the driver answers Probe.
func TestLivenessProbe(t *testing.T) {
	drv := csitest.New(t, csitest.Options{})
	health := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- livenessProbe(ctx, []string{"--csi-address=" + drv.Endpoint(), "--http-endpoint=" + health})
	}()
	waitFor(t, "/healthz ok", func() bool { return healthz(t, health) == http.StatusOK })
	drv.Stop()
	waitFor(t, "/healthz failing with the driver gone", func() bool { return healthz(t, health) == http.StatusInternalServerError })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// freeAddr is a loopback address with a port free now, for a server the
// code under test starts itself.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// healthz is the status of GET /healthz on addr, 0 when it does not answer.
func healthz(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitFor polls cond every 10 ms for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
