// Package backoff is nodevol's one retry policy: how long to wait after
// consecutive failures, and the timer that wakes a loop when that wait ends.
package backoff

import (
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// APIJitter is the jitter of retries against the API server: each wait is
// lengthened by up to a fifth, so that after an outage the nodes of a
// cluster do not all retry at the same moment (the gRPC connect backoff's
// default jitter).
const APIJitter = 0.2

// Policy is an exponential backoff: Initial after the first failure,
// doubled after each further one up to Max (apimachinery's wait.Backoff
// with Factor 2 and Cap Max, the kubelet's exponentialbackoff), then
// lengthened by a random fraction of up to Jitter of itself (as
// wait.Jitter, but from an injectable source). A Policy is a value: safe
// for concurrent use when Rand is.
type Policy struct {
	// Initial is the wait after the first failure. Required (> 0).
	Initial time.Duration
	// Max caps the doubled wait, before jitter. Zero: no cap.
	Max time.Duration
	// Jitter lengthens each wait by Rand()*Jitter of itself. Zero: none,
	// for waits that must be deterministic (the volume operations', which
	// the scenario scripts print); APIJitter for API server retries.
	Jitter float64
	// Rand returns a number in [0, 1) for the jitter. Default
	// math/rand/v2.Float64 (safe for concurrent use); tests inject a
	// seeded source.
	Rand func() float64
}

// Delay returns the wait after the given number of consecutive failures
// (0 for none).
func (p Policy) Delay(failures int) time.Duration {
	if failures < 1 || p.Initial <= 0 {
		return 0
	}
	// Step stops the doubling once it reaches the cap (it sets Steps to
	// 0 and Duration to Max), so a long run of failures costs no more
	// than the doublings up to Max; the later failures wait Duration.
	b := wait.Backoff{Duration: p.Initial, Factor: 2, Steps: failures, Cap: p.Max}
	var d time.Duration
	for n := 0; n < failures; n++ {
		if b.Steps == 0 {
			d = b.Duration
			break
		}
		d = b.Step()
	}
	if p.Max > 0 {
		d = min(d, p.Max)
	}
	if p.Jitter > 0 {
		r := p.Rand
		if r == nil {
			r = rand.Float64
		}
		d += time.Duration(r() * p.Jitter * float64(d))
	}
	return d
}
