package report

import (
	"cmp"
	"slices"
	"strings"

	"github.com/onsi/ginkgo/v2/types"
)

// The two sides of a comparison.
const (
	StockSide = "stock"
	ForkSide  = "fork"
)

// Row is one spec and what became of it on each side.
type Row struct {
	Text        string   // ginkgo's full text: containers' texts and the It's
	Tags        []string // ginkgo labels and the text's [bracketed] tags
	Stock, Fork Result
	// Reason is the written reason of the first Reasons entry that
	// matches the text, set only when neither side passed.
	Reason string
}

// Regression reports whether the spec passes on stock and not on the fork.
func (r Row) Regression() bool { return r.Stock.Outcome == Passed && r.Fork.Outcome != Passed }

// Fixed reports whether the spec passes on the fork and not on stock.
func (r Row) Fixed() bool { return r.Fork.Outcome == Passed && r.Stock.Outcome != Passed }

// NeitherPasses reports whether the spec passes on neither side.
func (r Row) NeitherPasses() bool { return r.Stock.Outcome != Passed && r.Fork.Outcome != Passed }

// group orders rows: regressions, then fixed, then other differences,
// then the rest.
func (r Row) group() int {
	switch {
	case r.Regression():
		return 0
	case r.Fixed():
		return 1
	case r.Stock.Outcome != r.Fork.Outcome:
		return 2
	default:
		return 3
	}
}

// Side is one run's totals.
type Side struct {
	Name string
	// Counts holds the number of rows with each outcome.
	Counts map[Outcome]int
	// SuiteSucceeded is ginkgo's verdict on the whole run.
	SuiteSucceeded bool
	// SuiteFailures are ginkgo's special failure reasons (an interrupt, a
	// timeout) and failed suite-level nodes (BeforeSuite, AfterSuite,
	// ReportAfterSuite, ...), each "NodeType state: cause".
	SuiteFailures []string
}

// Comparison is two runs of a suite, spec for spec.
type Comparison struct {
	// Suite is the suite's description, from the stock report.
	Suite string
	// Rows has the specs that ran on at least one side (not NotRun on
	// both): regressions first, then specs fixed on the fork, then other
	// differences, then the rest, each group by text.
	Rows []Row
	// NotRunEither counts the specs not run on either side (outside the
	// runs' focus), left out of Rows.
	NotRunEither int
	Stock, Fork  Side
	// Unused are the reasons that match no row that passes on neither
	// side: a spec since fixed, renamed, or outside this run's focus.
	Unused Reasons
}

// Compare compares the stock kubelet's run with the fork's. Specs are
// matched by full text; specs sharing a text, by the order of their It's
// location. It does no I/O.
func Compare(stock, fork []types.Report, reasons Reasons) Comparison {
	stockSpecs, stockSuite := specs(stock)
	forkSpecs, forkSuite := specs(fork)

	rows := map[string]*Row{}
	var order []string
	add := func(s spec) *Row {
		row, ok := rows[s.key]
		if !ok {
			row = &Row{Text: s.text}
			rows[s.key] = row
			order = append(order, s.key)
		}
		row.Tags = mergeSorted(row.Tags, s.tags)
		return row
	}
	for _, s := range stockSpecs {
		add(s).Stock = s.result
	}
	for _, s := range forkSpecs {
		add(s).Fork = s.result
	}

	c := Comparison{
		Stock: side(StockSide, stock, stockSuite),
		Fork:  side(ForkSide, fork, forkSuite),
	}
	if len(stock) > 0 {
		c.Suite = stock[0].SuiteDescription
	}
	used := make([]bool, len(reasons))
	for _, key := range order {
		row := *rows[key]
		if row.Stock.Outcome == NotRun && row.Fork.Outcome == NotRun {
			c.NotRunEither++
			continue
		}
		if row.NeitherPasses() {
			if i := reasons.match(row.Text); i >= 0 {
				row.Reason = reasons[i].Text
				used[i] = true
			}
		}
		c.Stock.Counts[row.Stock.Outcome]++
		c.Fork.Counts[row.Fork.Outcome]++
		c.Rows = append(c.Rows, row)
	}
	for i, r := range reasons {
		if !used[i] {
			c.Unused = append(c.Unused, r)
		}
	}
	slices.SortStableFunc(c.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.group(), b.group()), strings.Compare(a.Text, b.Text))
	})
	return c
}

func side(name string, reports []types.Report, suiteFailures []string) Side {
	s := Side{Name: name, Counts: map[Outcome]int{}, SuiteSucceeded: len(reports) > 0, SuiteFailures: suiteFailures}
	for _, r := range reports {
		s.SuiteSucceeded = s.SuiteSucceeded && r.SuiteSucceeded
	}
	return s
}

// mergeSorted merges two sorted sets of strings.
func mergeSorted(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// Regressions returns the rows that pass on stock and not on the fork.
func (c Comparison) Regressions() []Row { return c.filter(Row.Regression) }

// Fixed returns the rows that pass on the fork and not on stock.
func (c Comparison) Fixed() []Row { return c.filter(Row.Fixed) }

// NeitherPasses returns the rows that pass on neither side.
func (c Comparison) NeitherPasses() []Row { return c.filter(Row.NeitherPasses) }

func (c Comparison) filter(keep func(Row) bool) []Row {
	var out []Row
	for _, r := range c.Rows {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}
