package report

import (
	"encoding/json"
	"io"
)

// Summary is the comparison's machine-readable summary (JSON): what the
// Makefile checks. Lists are empty, never null.
type Summary struct {
	Suite string `json:"suite"`
	// Specs counts the specs that ran on at least one side (the table's
	// rows), NotRunEither those that ran on neither.
	Specs        int         `json:"specs"`
	NotRunEither int         `json:"notRunOnEitherSide"`
	Stock        SideSummary `json:"stock"`
	Fork         SideSummary `json:"fork"`
	// Regressions pass on stock and not on the fork.
	Regressions []Change `json:"regressions"`
	// Fixed pass on the fork and not on stock.
	Fixed []Change `json:"fixed"`
	// NeitherPasses counts the specs that pass on neither side;
	// Unexplained lists those of them without a written reason.
	NeitherPasses int      `json:"neitherPasses"`
	Unexplained   []string `json:"unexplained"`
	// UnusedReasons are the reasons file's entries ("substring => reason")
	// that matched no spec passing on neither side.
	UnusedReasons []string `json:"unusedReasons"`
}

// SideSummary is one run's counts over the table's rows.
type SideSummary struct {
	Passed         int      `json:"passed"`
	Failed         int      `json:"failed"`
	Skipped        int      `json:"skipped"`
	Pending        int      `json:"pending"`
	NotRun         int      `json:"notRun"`
	SuiteSucceeded bool     `json:"suiteSucceeded"`
	SuiteFailures  []string `json:"suiteFailures"`
}

// Change is a spec whose outcome differs, with each side's result as the
// table shows it.
type Change struct {
	Spec  string `json:"spec"`
	Stock string `json:"stock"`
	Fork  string `json:"fork"`
}

// Summary returns the comparison's summary.
func (c Comparison) Summary() Summary {
	s := Summary{
		Suite:         c.Suite,
		Specs:         len(c.Rows),
		NotRunEither:  c.NotRunEither,
		Stock:         sideSummary(c.Stock),
		Fork:          sideSummary(c.Fork),
		Regressions:   changes(c.Regressions()),
		Fixed:         changes(c.Fixed()),
		Unexplained:   []string{},
		UnusedReasons: []string{},
	}
	for _, r := range c.NeitherPasses() {
		s.NeitherPasses++
		if r.Reason == "" {
			s.Unexplained = append(s.Unexplained, r.Text)
		}
	}
	for _, r := range c.Unused {
		s.UnusedReasons = append(s.UnusedReasons, r.Substring+reasonSep+r.Text)
	}
	return s
}

func sideSummary(s Side) SideSummary {
	return SideSummary{
		Passed:         s.Counts[Passed],
		Failed:         s.Counts[Failed],
		Skipped:        s.Counts[Skipped],
		Pending:        s.Counts[Pending],
		NotRun:         s.Counts[NotRun],
		SuiteSucceeded: s.SuiteSucceeded,
		SuiteFailures:  append([]string{}, s.SuiteFailures...),
	}
}

func changes(rows []Row) []Change {
	out := []Change{}
	for _, r := range rows {
		out = append(out, Change{Spec: r.Text, Stock: r.Stock.String(), Fork: r.Fork.String()})
	}
	return out
}

// WriteSummary writes the comparison's summary as indented JSON.
func WriteSummary(w io.Writer, c Comparison) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(c.Summary())
}
