// Command conformance-report compares two ginkgo JSON reports of one suite,
// the stock kubelet's run and the fork's, spec for spec:
//
//	conformance-report -stock stock.json -fork fork.json \
//		[-reasons e2e_node.reasons] [-markdown table.md] [-summary summary.json]
//
// It writes the Markdown table (to standard output unless -markdown names a
// file) and the JSON summary (package report's Summary) when -summary names
// a file. It exits 1 when a spec passes on stock and not on the fork (after
// writing both), 2 when it cannot read its input or write its output, and
// 0 otherwise.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/nodevol/nodevol/conformance/internal/report"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command with its arguments and output streams; it returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("conformance-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stockPath := fs.String("stock", "", "ginkgo JSON report of the stock kubelet's run, or the reports of its parts separated by commas (required)")
	forkPath := fs.String("fork", "", "ginkgo JSON report of the fork's run, or the reports of its parts separated by commas (required)")
	reasonsPath := fs.String("reasons", "", `file of "spec text substring => reason" lines for specs that pass on neither side`)
	markdownPath := fs.String("markdown", "", "write the Markdown table here (default: standard output)")
	summaryPath := fs.String("summary", "", "write the JSON summary here")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *stockPath == "" || *forkPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "conformance-report: want -stock and -fork, and no arguments")
		fs.Usage()
		return 2
	}
	c, err := compare(*stockPath, *forkPath, *reasonsPath)
	if err == nil {
		err = write(c, stdout, *markdownPath, *summaryPath)
	}
	if err != nil {
		fmt.Fprintf(stderr, "conformance-report: %v\n", err)
		return 2
	}
	if n := len(c.Regressions()); n > 0 {
		fmt.Fprintf(stderr, "conformance-report: %d specs pass on %s and not on the %s\n", n, report.StockSide, report.ForkSide)
		return 1
	}
	return 0
}

func compare(stockPath, forkPath, reasonsPath string) (report.Comparison, error) {
	stock, err := load(stockPath)
	if err != nil {
		return report.Comparison{}, err
	}
	fork, err := load(forkPath)
	if err != nil {
		return report.Comparison{}, err
	}
	var reasons report.Reasons
	if reasonsPath != "" {
		f, err := os.Open(reasonsPath)
		if err != nil {
			return report.Comparison{}, err
		}
		defer f.Close()
		if reasons, err = report.ParseReasons(f); err != nil {
			return report.Comparison{}, fmt.Errorf("%s: %w", reasonsPath, err)
		}
	}
	return report.Compare(stock, fork, reasons), nil
}

// load reads the reports at paths, separated by commas: a run's, or its
// parts' (node-conformance -shard).
func load(paths string) ([]types.Report, error) {
	var all []types.Report
	for _, path := range strings.Split(paths, ",") {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		reports, err := report.Load(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		all = append(all, reports...)
	}
	return all, nil
}

func write(c report.Comparison, stdout io.Writer, markdownPath, summaryPath string) error {
	if markdownPath == "" {
		if err := report.WriteMarkdown(stdout, c); err != nil {
			return err
		}
	} else if err := writeFile(markdownPath, func(w io.Writer) error { return report.WriteMarkdown(w, c) }); err != nil {
		return err
	}
	if summaryPath == "" {
		return nil
	}
	return writeFile(summaryPath, func(w io.Writer) error { return report.WriteSummary(w, c) })
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(write(f), f.Close())
}
