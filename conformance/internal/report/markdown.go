package report

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// WriteMarkdown writes the comparison as Markdown: the counts per side,
// the regressions, the specs fixed on the fork, reasons that matched
// nothing, and one table row per spec (Rows' order).
func WriteMarkdown(w io.Writer, c Comparison) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }

	title := c.Suite
	if title == "" {
		title = "Suite"
	}
	p("# %s: %s and %s kubelets\n\n", cell(title), StockSide, ForkSide)
	p("| | %s | %s |\n|---|---:|---:|\n", StockSide, ForkSide)
	for _, o := range outcomes {
		p("| %s | %d | %d |\n", o, c.Stock.Counts[o], c.Fork.Counts[o])
	}
	p("| suite | %s | %s |\n\n", verdict(c.Stock), verdict(c.Fork))
	p("%d specs ran on at least one side; %d more ran on neither (outside the runs' focus, or never started) and are not listed.\n",
		len(c.Rows), c.NotRunEither)
	if len(c.Stock.SuiteFailures)+len(c.Fork.SuiteFailures) > 0 {
		p("\n")
	}
	for _, s := range []Side{c.Stock, c.Fork} {
		for _, f := range s.SuiteFailures {
			p("- %s suite failure: %s\n", s.Name, cell(f))
		}
	}

	regressions := c.Regressions()
	p("\n## Regressions: pass on %s, not on the %s (%d)\n\n", StockSide, ForkSide, len(regressions))
	if len(regressions) == 0 {
		p("None.\n")
	}
	for _, r := range regressions {
		p("- %s: %s %s\n", cell(r.Text), ForkSide, cell(r.Fork.String()))
	}

	fixed := c.Fixed()
	p("\n## Pass on the %s, not on %s (%d)\n\n", ForkSide, StockSide, len(fixed))
	if len(fixed) == 0 {
		p("None.\n")
	}
	for _, r := range fixed {
		p("- %s: %s %s\n", cell(r.Text), StockSide, cell(r.Stock.String()))
	}

	neither, explained := c.NeitherPasses(), 0
	for _, r := range neither {
		if r.Reason != "" {
			explained++
		}
	}
	p("\n## Pass on neither side (%d, %d with a written reason)\n", len(neither), explained)
	if len(c.Unused) > 0 {
		p("\nReasons that match no spec passing on neither side:\n\n")
		for _, r := range c.Unused {
			p("- line %d: %s%s%s\n", r.Line, cell(r.Substring), cell(reasonSep), cell(r.Text))
		}
	}

	p("\n## Specs\n\n| Spec | Tags | %s | %s | Reason |\n|---|---|---|---|---|\n", StockSide, ForkSide)
	for _, r := range c.Rows {
		p("| %s | %s | %s | %s | %s |\n", cell(r.Text), cell(strings.Join(r.Tags, ", ")),
			cell(r.Stock.String()), cell(r.Fork.String()), cell(r.Reason))
	}
	return bw.Flush()
}

func verdict(s Side) string {
	if s.SuiteSucceeded {
		return "succeeded"
	}
	return "failed"
}

// cellEscaper keeps text on one line and inside its table cell, and stops
// Markdown renderers from reading "<nil>" or "<*v1.Pod>" as HTML.
var cellEscaper = strings.NewReplacer("|", `\|`, "\r\n", " ", "\n", " ", "\r", " ", "<", "&lt;", ">", "&gt;")

func cell(s string) string { return cellEscaper.Replace(s) }
