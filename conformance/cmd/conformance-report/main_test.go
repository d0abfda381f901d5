package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/conformance/internal/report"
)

const testdata = "../../internal/report/testdata"

func TestRun(t *testing.T) {
	stock := filepath.Join(testdata, "stock.json")
	fork := filepath.Join(testdata, "fork.json")
	reasons := filepath.Join(testdata, "reasons.txt")
	dir := t.TempDir()
	md, summary := filepath.Join(dir, "table.md"), filepath.Join(dir, "summary.json")

	t.Run("regressions", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		code := run([]string{"-stock", stock, "-fork", fork, "-reasons", reasons, "-markdown", md, "-summary", summary}, &stdout, &stderr)
		if code != 1 {
			t.Fatalf("exit %d, want 1 (regressions); stderr: %s", code, stderr.String())
		}
		if stdout.Len() != 0 || !strings.Contains(stderr.String(), "6 specs pass on stock and not on the fork") {
			t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
		}
		s := readSummary(t, summary)
		if len(s.Regressions) != 6 || s.Stock.Passed != 7 {
			t.Errorf("summary: %d regressions, %d passed on stock; want 6 and 7", len(s.Regressions), s.Stock.Passed)
		}
		table, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(table, []byte("## Regressions: pass on stock, not on the fork (6)")) {
			t.Errorf("table:\n%s", table)
		}
	})
	t.Run("none", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-stock", stock, "-fork", stock}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d, want 0 for a run compared with itself; stderr: %s", code, stderr.String())
		}
		if !strings.HasPrefix(stdout.String(), "# E2eNode Suite: stock and fork kubelets\n") {
			t.Errorf("stdout does not start with the table:\n%s", stdout.String())
		}
	})
	t.Run("parts", func(t *testing.T) {
		// A run's parts, given as a list: here one report twice, whose
		// specs each count once.
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-stock", stock + "," + stock, "-fork", stock, "-summary", summary}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d, want 0; stderr: %s", code, stderr.String())
		}
		s := readSummary(t, summary)
		if s.Stock.Passed != 7 || s.Fork.Passed != 7 {
			t.Errorf("summary: %d passed on stock and %d on the fork, want 7 each", s.Stock.Passed, s.Fork.Passed)
		}
	})
	for name, args := range map[string][]string{
		"a part missing": {"-stock", stock + "," + filepath.Join(dir, "absent.json"), "-fork", fork},
		"no flags":       nil,
		"no fork":        {"-stock", stock},
		"an argument":    {"-stock", stock, "-fork", fork, "extra"},
		"missing report": {"-stock", stock, "-fork", filepath.Join(dir, "absent.json")},
		"not a report":   {"-stock", stock, "-fork", reasons},
		"bad reasons":    {"-stock", stock, "-fork", fork, "-reasons", stock},
		"unwritable":     {"-stock", stock, "-fork", fork, "-markdown", filepath.Join(dir, "no", "such", "dir")},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2; stderr: %s", code, stderr.String())
			}
		})
	}
}

// readSummary reads the JSON summary at path.
func readSummary(t *testing.T, path string) report.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s report.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCommittedReasons checks that the reasons file make
// test-node-conformance passes to the command parses.
func TestCommittedReasons(t *testing.T) {
	f, err := os.Open("../../e2e_node.reasons")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := report.ParseReasons(f); err != nil {
		t.Error(err)
	}
}
