// Package report compares two runs of one ginkgo suite, one per kubelet
// (the stock kubelet and nodevol's fork), spec for spec.
//
// Load reads a ginkgo v2 JSON report (the --json-report file: a list of
// github.com/onsi/ginkgo/v2/types.Report). Compare is a pure function from
// the two runs and the known reasons to a Comparison: one Row per spec that
// ran on at least one side, with each side's Result, and per side counts
// and suite-level failures. WriteMarkdown renders it as a table,
// Comparison.Summary as the machine-readable summary the Makefile checks.
//
// A spec's outcome on a side is one of passed, failed (ginkgo's failed,
// timedout, panicked, interrupted or aborted), skipped (Skip called, with
// its message), pending, or not run: absent from the report, or reported
// skipped without a message, which is what ginkgo reports for a spec left
// out by the run's focus or label filters, or never started because the
// suite was interrupted or its BeforeSuite failed.
//
// A regression is a spec that passes on stock and not on the fork. A spec
// that passes on neither side can carry a written reason (ParseReasons: a
// committed file of spec-text substrings and reasons), which the table shows.
package report
