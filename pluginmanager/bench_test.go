package pluginmanager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// BenchmarkRegistration measures the time from a registrar's socket
// creation to the handler's RegisterPlugin returning: fsnotify event,
// GetInfo, ValidatePlugin, RegisterPlugin (a fake handler). The resync
// period is long, so only events drive it.
func BenchmarkRegistration(b *testing.B) {
	dir := tempDir(b)
	registered := make(chan string, 1)
	h := &fakeHandler{onRegister: func(name string) { registered <- name }}
	startManager(b, dir, h, Options{ResyncPeriod: time.Hour})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("d%d.example.com", i)
		r, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: name})
		if err != nil {
			b.Fatal(err)
		}
		select {
		case got := <-registered:
			if got != name {
				b.Fatalf("registered %s, want %s", got, name)
			}
		case <-time.After(20 * time.Second):
			b.Fatalf("%s not registered", name)
		}
		b.StopTimer()
		if _, err := r.WaitForStatus(context.Background(), 1); err != nil {
			b.Fatal(err)
		}
		r.Stop()
		waitFor(b, "deregistration", func() bool { return h.count("deregister "+name) == 1 })
		b.StartTimer()
	}
}
