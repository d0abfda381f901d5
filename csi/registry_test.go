package csi

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

// drv is the test driver's name.
const drv = csitest.DefaultDriverName

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	srv := csitest.New(t, csitest.Options{NodeID: "n-1", MaxVolumes: 7, Expand: true, VolumeMountGroup: true})
	r := NewRegistry(RegistryOptions{})
	defer r.Close()
	var mu sync.Mutex
	var changes []string
	r.OnChange(func(d string) { mu.Lock(); changes = append(changes, d); mu.Unlock() })

	if err := r.Register(ctx, "../evil", srv.Endpoint()); err == nil || !strings.Contains(err.Error(), "invalid driver name") {
		t.Errorf("Register(../evil) = %v", err)
	}
	if err := r.Register(ctx, "x", filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Error("Register with nothing listening succeeded")
	}
	if _, err := r.Client("x"); !errors.Is(err, volume.ErrNotReady) {
		t.Errorf("a failed registration left a client: %v", err)
	}

	if err := r.Register(ctx, drv, "unix://"+srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	c, err := r.Client(drv)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Capabilities(); got != (Capabilities{StageUnstage: true, Expand: true, VolumeMountGroup: true}) {
		t.Errorf("Capabilities = %+v", got)
	}
	info, err := c.NodeGetInfo(ctx)
	if err != nil || info.NodeID != "n-1" || info.MaxVolumesPerNode != 7 {
		t.Errorf("NodeGetInfo = %+v, %v", info, err)
	}
	// Registering again makes a new connection, closes the old one and
	// fetches the capabilities again.
	if err := r.Register(ctx, drv, srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	c2, err := r.Client(drv)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Connections() != 2 || r.dials.Load() != 3 /* one to none.sock */ || srv.Calls("NodeGetCapabilities") != 2 {
		t.Errorf("re-registration: %d connections, %d dials (want 3), %d capability fetches (want 2)", srv.Connections(), r.dials.Load(), srv.Calls("NodeGetCapabilities"))
	}
	if _, err := c.NodeGetInfo(ctx); !volume.IsUncertain(err) {
		t.Errorf("a call on the replaced client = %v, want in progress (Canceled)", err)
	}
	if got := r.Drivers(); !slices.Equal(got, []string{drv}) {
		t.Errorf("Drivers = %v", got)
	}

	r.Deregister(drv)
	r.Deregister("never-registered")
	_, err = r.Client(drv)
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "driver name "+drv+" not found in the list of registered CSI drivers") {
		t.Errorf("Client after Deregister = %v", err)
	}
	if _, err := c2.NodeGetInfo(ctx); !volume.IsUncertain(err) {
		t.Errorf("a call on a deregistered driver's client = %v, want in progress (Canceled)", err)
	}
	mu.Lock()
	if want := []string{drv, drv, drv}; !slices.Equal(changes, want) {
		t.Errorf("OnChange saw %v, want %v", changes, want)
	}
	mu.Unlock()

	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := r.Register(ctx, drv, srv.Endpoint()); err == nil {
		t.Error("Register after Close succeeded")
	}
}

// TestDriverRestart: a driver that restarts on the same socket and
// registers again is usable at once.
func TestDriverRestart(t *testing.T) {
	ctx := context.Background()
	dir := csitest.SocketDir(t)
	srv, err := csitest.Start(dir, csitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(RegistryOptions{})
	defer r.Close()
	if err := r.Register(ctx, drv, srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	c, _ := r.Client(drv)
	if _, err := c.NodeGetInfo(ctx); !volume.IsUncertain(err) {
		t.Errorf("call to a stopped driver = %v, want in progress", err)
	}
	srv2, err := csitest.Start(dir, csitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Stop()
	if err := r.Register(ctx, drv, srv2.Endpoint()); err != nil {
		t.Fatalf("Register after restart: %v", err)
	}
	c, _ = r.Client(drv)
	if _, err := c.NodeGetInfo(ctx); err != nil {
		t.Errorf("NodeGetInfo after restart: %v", err)
	}
}
