package registration

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

// TestAllocatableRefreshStopsWhenDeregistered: a deregistered driver is no
// longer refreshed, neither by its period nor after a ResourceExhausted,
// and nothing stays scheduled for it.
func TestAllocatableRefreshStopsWhenDeregistered(t *testing.T) {
	h, d, _, drivers, clk, ctx := refreshSetup(t)
	if err := drivers.Add(periodDriver("a.example.com", ptr.To[int64](60))); err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	if next := h.refresh.sync(ctx); next.Sub(start) != time.Minute {
		t.Fatalf("next refresh at +%v, want +1m", next.Sub(start))
	}
	clk.Step(time.Minute)
	h.refresh.sync(ctx)
	calls := func() int { d.mu.Lock(); defer d.mu.Unlock(); return d.infoCalls }
	if n := calls(); n != 2 {
		t.Fatalf("NodeGetInfo called %d times after one period, want 2 (registration and refresh)", n)
	}
	h.mu.Lock()
	endpoint := h.drivers["a.example.com"].endpoint
	h.mu.Unlock()
	if err := h.DeRegisterPlugin(ctx, "a.example.com", endpoint); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Hour)
	h.ResourceExhausted("a.example.com")
	if next := h.refresh.sync(ctx); !next.IsZero() {
		t.Errorf("next refresh at +%v after deregistration, want none", next.Sub(start))
	}
	if n := calls(); n != 2 {
		t.Errorf("NodeGetInfo called %d times, want no call after deregistration", n)
	}
}
