package backoff

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestDelay: the wait doubles from Initial per failure and stops at Max;
// without jitter it is the kubelet's exponentialbackoff (500 ms to 2m2s).
func TestDelay(t *testing.T) {
	kubelet := Policy{Initial: 500 * time.Millisecond, Max: 2*time.Minute + 2*time.Second}
	for _, tt := range []struct {
		name     string
		p        Policy
		failures int
		want     time.Duration
	}{
		{"no failure", kubelet, 0, 0},
		{"first", kubelet, 1, 500 * time.Millisecond},
		{"second", kubelet, 2, time.Second},
		{"third", kubelet, 3, 2 * time.Second},
		{"eighth", kubelet, 8, 64 * time.Second},
		{"ninth reaches the cap", kubelet, 9, 122 * time.Second},
		{"far past the cap", kubelet, 1 << 30, 122 * time.Second},
		{"no cap", Policy{Initial: time.Second}, 11, 1024 * time.Second},
		{"initial above max", Policy{Initial: time.Minute, Max: time.Second}, 1, time.Second},
		{"no initial", Policy{Max: time.Second}, 3, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Delay(tt.failures); got != tt.want {
				t.Errorf("Delay(%d) = %v, want %v", tt.failures, got, tt.want)
			}
		})
	}
}

// TestDelayMatchesTheDoubling: Delay gives what the hand-written doublings
// it replaced gave (initial doubled per failure after the first while below
// max, then capped), for every count and a few policies.
func TestDelayMatchesTheDoubling(t *testing.T) {
	doubling := func(failures int, initial, max time.Duration) time.Duration {
		d := initial
		for i := 1; i < failures && d < max; i++ {
			d *= 2
		}
		return min(d, max)
	}
	for _, p := range []Policy{
		{Initial: 500 * time.Millisecond, Max: 2*time.Minute + 2*time.Second},
		{Initial: 500 * time.Millisecond, Max: 2 * time.Minute},
		{Initial: 100 * time.Millisecond, Max: 30 * time.Second},
		{Initial: 100 * time.Millisecond, Max: time.Second},
		{Initial: 3 * time.Millisecond, Max: 7 * time.Millisecond},
		{Initial: time.Second, Max: time.Second},
	} {
		for n := 1; n < 40; n++ {
			if got, want := p.Delay(n), doubling(n, p.Initial, p.Max); got != want {
				t.Errorf("%+v: Delay(%d) = %v, want %v", p, n, got, want)
			}
		}
	}
}

// TestDelayJitter: jitter lengthens the wait by Rand()*Jitter of itself,
// after the cap, and a seeded source gives waits that differ between nodes
// but stay within [wait, wait*(1+Jitter)).
func TestDelayJitter(t *testing.T) {
	fixed := func(v float64) func() float64 { return func() float64 { return v } }
	p := Policy{Initial: time.Second, Max: 10 * time.Second, Jitter: APIJitter}
	for _, tt := range []struct {
		name     string
		rand     float64
		failures int
		want     time.Duration
	}{
		{"zero draw", 0, 1, time.Second},
		{"half draw", 0.5, 1, 1100 * time.Millisecond},
		{"half draw, doubled", 0.5, 2, 2200 * time.Millisecond},
		{"half draw at the cap", 0.5, 20, 11 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := p
			p.Rand = fixed(tt.rand)
			if got := p.Delay(tt.failures); got != tt.want {
				t.Errorf("Delay(%d) = %v, want %v", tt.failures, got, tt.want)
			}
		})
	}

	p.Rand = rand.New(rand.NewPCG(24, 1)).Float64
	seen := map[time.Duration]bool{}
	for range 100 {
		d := p.Delay(3)
		if d < 4*time.Second || d >= 4800*time.Millisecond {
			t.Fatalf("Delay(3) = %v, want within [4s, 4.8s)", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("100 jittered waits took only %d values: nodes would retry in lockstep", len(seen))
	}
}
