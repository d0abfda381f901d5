package reconciler

import (
	"testing"
	"time"

	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// TestFailureLog: the rule of docs/OPERATIONS.md. Of identical failures of
// one key, the first burst are logged, then one a interval, which counts
// those not logged since; another error, another operation or a success
// starts again; keys are independent.
func TestFailureLog(t *testing.T) {
	a, b := oe.Key{Volume: "v"}, oe.Key{Volume: "v", Pod: "p"}
	t0 := time.Unix(1000, 0)
	type step struct {
		at      time.Duration // after t0
		key     oe.Key
		kind    oe.OpKind
		err     string // "" with ok: a success
		ok      bool
		log     bool
		dropped int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"burst then one a minute with the count", []step{
			{at: 0, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: time.Second, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 2 * time.Second, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 3 * time.Second, key: a, kind: oe.OpStage, err: "x"},
			{at: 4 * time.Second, key: a, kind: oe.OpStage, err: "x"},
			{at: 61 * time.Second, key: a, kind: oe.OpStage, err: "x"},
			{at: 62 * time.Second, key: a, kind: oe.OpStage, err: "x", log: true, dropped: 3},
			{at: 63 * time.Second, key: a, kind: oe.OpStage, err: "x"},
			{at: 122 * time.Second, key: a, kind: oe.OpStage, err: "x", log: true, dropped: 1},
		}},
		{"another error text is logged at once and starts again", []step{
			{at: 0, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 1, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 2, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 3, key: a, kind: oe.OpStage, err: "x"},
			{at: 4, key: a, kind: oe.OpStage, err: "y", log: true},
			{at: 5, key: a, kind: oe.OpStage, err: "y", log: true},
		}},
		{"another operation starts again", []step{
			{at: 0, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 1, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 2, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 3, key: a, kind: oe.OpUnstage, err: "x", log: true},
		}},
		{"a success starts again", []step{
			{at: 0, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 1, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 2, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 3, key: a, ok: true},
			{at: 4, key: a, kind: oe.OpStage, err: "x", log: true},
		}},
		{"keys are independent", []step{
			{at: 0, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 1, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 2, key: a, kind: oe.OpStage, err: "x", log: true},
			{at: 3, key: b, kind: oe.OpStage, err: "x", log: true},
			{at: 4, key: a, kind: oe.OpStage, err: "x"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFailureLog(3, time.Minute)
			for i, s := range tt.steps {
				if s.ok {
					f.succeeded(s.key)
					continue
				}
				log, dropped := f.failed(s.key, s.kind, s.err, t0.Add(s.at))
				if log != s.log || dropped != s.dropped {
					t.Errorf("step %d: log %v, suppressed %d; want %v, %d", i, log, dropped, s.log, s.dropped)
				}
			}
		})
	}
}
