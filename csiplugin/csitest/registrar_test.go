package csitest

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestRegistrar(t *testing.T) {
	dir := SocketDir(t)
	// A stale file of the same name is replaced.
	if err := os.WriteFile(dir+"/a.example.com-reg.sock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := StartRegistrar(RegistrarConfig{Dir: dir, DriverName: "a.example.com", Endpoint: "/csi/a.sock"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if r.SocketPath() != dir+"/a.example.com-reg.sock" {
		t.Errorf("SocketPath = %q", r.SocketPath())
	}
	conn, err := grpc.NewClient("unix://"+r.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "a.example.com" || info.Endpoint != "/csi/a.sock" ||
		!slices.Equal(info.SupportedVersions, []string{"1.0.0"}) {
		t.Errorf("GetInfo = %v", info)
	}
	if r.GetInfoCalls() != 1 {
		t.Errorf("GetInfoCalls = %d", r.GetInfoCalls())
	}
	for _, s := range []*registerapi.RegistrationStatus{{PluginRegistered: false, Error: "nope"}, {PluginRegistered: true}} {
		if _, err := client.NotifyRegistrationStatus(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := r.WaitForStatus(ctx, 2); err != nil || !s.Registered {
		t.Errorf("WaitForStatus(2) = %+v, %v", s, err)
	}
	want := []RegistrarStatus{{Error: "nope"}, {Registered: true}}
	if got := r.statusesSoFar(); !slices.Equal(got, want) {
		t.Errorf("Statuses = %+v, want %+v", got, want)
	}
	short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancelShort()
	if _, err := r.WaitForStatus(short, 3); err == nil {
		t.Error("WaitForStatus(3) = nil error, want the context's")
	}
	r.Stop()
	r.Stop()
	if _, err := os.Lstat(r.SocketPath()); !os.IsNotExist(err) {
		t.Errorf("socket left after Stop: %v", err)
	}
}

func TestRegistrarConfigErrors(t *testing.T) {
	for _, cfg := range []RegistrarConfig{
		{DriverName: "a.example.com"},
		{Dir: os.TempDir(), DriverName: "../x"},
		{Dir: os.TempDir()},
		{Dir: "/nonexistent-dir", DriverName: "a.example.com"},
	} {
		if r, err := StartRegistrar(cfg); err == nil {
			r.Stop()
			t.Errorf("StartRegistrar(%+v) = nil error", cfg)
		}
	}
}
