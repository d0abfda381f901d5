package report

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/onsi/ginkgo/v2/types"
)

// Outcome is what became of a spec in one run.
type Outcome uint8

const (
	// NotRun: absent from the report, or reported skipped without a
	// message (left out by the run's filters, or never started because
	// the suite was interrupted or failed before it).
	NotRun Outcome = iota
	Passed
	// Failed covers ginkgo's failed, timedout, panicked, interrupted and
	// aborted.
	Failed
	// Skipped: the spec (or a node before it) called Skip, or ginkgo
	// skipped it with a message, as after a failure in an ordered
	// container.
	Skipped
	Pending
)

// outcomes lists the outcomes in the order of the tables.
var outcomes = []Outcome{Passed, Failed, Skipped, Pending, NotRun}

func (o Outcome) String() string {
	switch o {
	case Passed:
		return "passed"
	case Failed:
		return "failed"
	case Skipped:
		return "skipped"
	case Pending:
		return "pending"
	default:
		return "not run"
	}
}

// Result is a spec's outcome in one run.
type Result struct {
	Outcome Outcome
	// State is ginkgo's state when it says more than Outcome does:
	// "timedout", "panicked", "interrupted" or "aborted" for Failed, ""
	// otherwise.
	State string
	// Cause is the first non-empty line of the failure (or skip)
	// message, trimmed; "" when there is none.
	Cause string
	// Attempts is how often ginkgo ran the spec when it retried it
	// (--flake-attempts, MustPassRepeatedly); 0 or 1 otherwise.
	Attempts int
}

// String renders the result as a table cell: "passed", "failed: cause",
// "timedout: cause", "skipped: message", "passed (2 attempts)".
func (r Result) String() string {
	s := r.Outcome.String()
	if r.State != "" {
		s = r.State
	}
	if r.Attempts > 1 {
		s += fmt.Sprintf(" (%d attempts)", r.Attempts)
	}
	if r.Cause != "" {
		s += ": " + r.Cause
	}
	return s
}

// result turns a ginkgo spec report into a Result.
func result(sr types.SpecReport) Result {
	r := Result{Cause: firstLine(sr.Failure.Message)}
	if sr.NumAttempts > 1 {
		r.Attempts = sr.NumAttempts
	}
	switch {
	case sr.State == types.SpecStatePassed:
		r.Outcome = Passed
	case sr.State == types.SpecStatePending:
		r.Outcome = Pending
	case sr.State == types.SpecStateSkipped && sr.Failure.IsZero():
		r.Outcome = NotRun
	case sr.State == types.SpecStateSkipped:
		r.Outcome = Skipped
	case sr.State.Is(types.SpecStateFailureStates):
		r.Outcome = Failed
		if sr.State != types.SpecStateFailed {
			r.State = sr.State.String()
		}
	default:
		r.Outcome = Failed
		r.State = sr.State.String()
	}
	if r.Outcome == NotRun || r.Outcome == Pending {
		r.Attempts = 0
	}
	return r
}

// firstLine returns s's first non-empty line, trimmed.
func firstLine(s string) string {
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			return line
		}
	}
	return ""
}

// tagRE matches a "[NodeConformance]"-style tag in a spec's text.
var tagRE = regexp.MustCompile(`\[([^\[\]]+)\]`)

// tags returns the spec's ginkgo labels and the bracketed tags of its
// text, sorted, each once (the Kubernetes e2e framework writes most
// labels into the text too).
func tags(sr types.SpecReport, text string) []string {
	out := slices.Clone(sr.Labels())
	for _, m := range tagRE.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// spec is one spec of a run: its text, tags and result.
type spec struct {
	key    string // text, with a suffix for the second spec of a text and on
	text   string
	loc    types.CodeLocation // the It's
	tags   []string
	result Result
}

// specs returns the It specs of the runs and the runs' suite-level failures
// (ginkgo's special failure reasons, such as an interrupt, and failed
// BeforeSuite, AfterSuite and report nodes). Specs sharing a text are
// numbered in the order of their It's location, which is the same in both
// runs of one test binary (report order is completion order in a parallel
// run). Reports of parts of one suite (node-conformance -shard) each list
// every spec, those of the other parts as not run: a spec is the one
// report's that ran it. A spec that several reports ran is the last one's:
// a later report is a rerun (of specs whose image was wrong, say).
func specs(reports []types.Report) ([]spec, []string) {
	var out []spec
	var suite []string
	at := map[string]int{} // key -> index in out
	for _, rep := range reports {
		suite = append(suite, rep.SpecialSuiteFailureReasons...)
		var mine []spec
		for _, sr := range rep.SpecReports {
			if sr.LeafNodeType.Is(types.NodeTypesForSuiteLevelNodes) {
				if sr.State.Is(types.SpecStateFailureStates) {
					suite = append(suite, fmt.Sprintf("%s %s: %s", sr.LeafNodeType, sr.State, firstLine(sr.Failure.Message)))
				}
				continue
			}
			if sr.LeafNodeType != types.NodeTypeIt {
				continue
			}
			text := sr.FullText()
			mine = append(mine, spec{text: text, loc: sr.LeafNodeLocation, tags: tags(sr, text), result: result(sr)})
		}
		slices.SortStableFunc(mine, func(a, b spec) int {
			return cmp.Or(strings.Compare(a.text, b.text), strings.Compare(a.loc.FileName, b.loc.FileName),
				cmp.Compare(a.loc.LineNumber, b.loc.LineNumber))
		})
		for i, n := 0, 0; i < len(mine); i++ {
			n++
			if i == 0 || mine[i-1].text != mine[i].text {
				n = 0
			}
			mine[i].key = mine[i].text
			if n > 0 {
				mine[i].key = fmt.Sprintf("%s\x00%d", mine[i].text, n)
			}
			if j, ok := at[mine[i].key]; ok {
				if out[j].result.Outcome == NotRun || mine[i].result.Outcome != NotRun {
					out[j] = mine[i]
				}
				continue
			}
			at[mine[i].key] = len(out)
			out = append(out, mine[i])
		}
	}
	return out, suite
}
