package reconciler

import (
	"time"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// Failure lines are rate-limited, never silenced: of the failures of one
// operation key (volume, or volume and pod) that repeat the same operation
// with the same error text, the first failureLogBurst are logged; after
// them, at most one line per failureLogInterval, which says how many
// failures were not logged since the line before (suppressed). A failure
// with another operation or another error text is logged at once and
// starts the count again; so does a success. Events are not limited here:
// the EventRecorder's own correlator aggregates repeated events.
const (
	// failureLogBurst: a driver failing fast (backoff from 500ms) has its
	// first seconds of failures all in the log, enough to see the pattern.
	failureLogBurst = 5
	// failureLogInterval: a failure that lasts gets a line a minute,
	// which says it still fails and how often, without flooding the log
	// when its backoff is reset (a driver re-registering, a changed
	// VolumeAttachment) and it fails every half second.
	failureLogInterval = time.Minute
)

// failureLog decides which failures are logged. Pure: time is an input.
// Not safe for concurrent use (the loop owns it).
type failureLog struct {
	burst    int
	interval time.Duration
	keys     map[oe.Key]*failureRun
}

// failureRun is the run of identical failures of one key.
type failureRun struct {
	kind oe.OpKind
	err  string
	// count is the failures of the run; suppressed those not logged
	// since the last line, logged when that line was.
	count, suppressed int
	logged            time.Time
}

func newFailureLog(burst int, interval time.Duration) *failureLog {
	return &failureLog{burst: burst, interval: interval, keys: map[oe.Key]*failureRun{}}
}

// failed counts a failure at now and reports whether to log it, with the
// number of identical failures not logged since the last line.
func (f *failureLog) failed(key oe.Key, kind oe.OpKind, errText string, now time.Time) (log bool, suppressed int) {
	r := f.keys[key]
	if r == nil || r.kind != kind || r.err != errText {
		f.keys[key] = &failureRun{kind: kind, err: errText, count: 1, logged: now}
		return true, 0
	}
	r.count++
	if r.count <= f.burst || now.Sub(r.logged) >= f.interval {
		suppressed, r.suppressed, r.logged = r.suppressed, 0, now
		return true, suppressed
	}
	r.suppressed++
	return false, 0
}

// succeeded ends the key's run.
func (f *failureLog) succeeded(key oe.Key) { delete(f.keys, key) }

// forgetVolume ends the runs of every key of a volume the loop forgets.
func (f *failureLog) forgetVolume(name podvol.UniqueVolumeName) {
	for k := range f.keys {
		if k.Volume == name {
			delete(f.keys, k)
		}
	}
}

// rfc3339Milli is RFC 3339 with milliseconds: the next retry of a failure
// comes within a second at first.
const rfc3339Milli = "2006-01-02T15:04:05.000Z07:00"

// nodeLevel reports whether an operation concerns no pod any more (its
// failure event goes on the Node): the unstage and the detach that follow
// the last unpublish.
func nodeLevel(kind oe.OpKind) bool { return kind == oe.OpUnstage || kind == oe.OpSelfDetach }
