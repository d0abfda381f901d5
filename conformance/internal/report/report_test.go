package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/onsi/ginkgo/v2/types"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func loadFile(t *testing.T, name string) []types.Report {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reports, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return reports
}

func loadReasons(t *testing.T) Reasons {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "reasons.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reasons, err := ParseReasons(f)
	if err != nil {
		t.Fatal(err)
	}
	return reasons
}

// TestFixturesAreGinkgoReports decodes the hand-written fixtures strictly
// into ginkgo's own types, so that a misspelt or invented field fails
// instead of being ignored.
func TestFixturesAreGinkgoReports(t *testing.T) {
	for _, name := range []string{"stock.json", "fork.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var reports []types.Report
		if err := dec.Decode(&reports); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestLoad(t *testing.T) {
	one := `{"SuiteDescription": "S", "SuiteSucceeded": true, "SpecReports": [{"LeafNodeType": "It", "LeafNodeText": "a", "State": "passed"}]}`
	for _, tc := range []struct {
		name, in string
		specs    int // -1: want an error
	}{
		{"list", "[" + one + "," + one + "]", 2},
		{"single suite", one, 1},
		{"empty", " \n", -1},
		{"no suite", "[]", -1},
		{"not JSON", "E2eNode Suite", -1},
		{"bad state", `[{"SpecReports": [{"State": 7}]}]`, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reports, err := Load(strings.NewReader(tc.in))
			if tc.specs < 0 {
				if err == nil {
					t.Fatalf("Load = %d reports, want an error", len(reports))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range reports {
				n += len(r.SpecReports)
			}
			if n != tc.specs {
				t.Errorf("%d spec reports, want %d", n, tc.specs)
			}
		})
	}
}

func TestResult(t *testing.T) {
	failure := func(msg string) types.Failure {
		return types.Failure{Message: msg, Location: types.CodeLocation{FileName: "x_test.go", LineNumber: 1}}
	}
	for _, tc := range []struct {
		name string
		sr   types.SpecReport
		want string
	}{
		{"passed", types.SpecReport{State: types.SpecStatePassed, NumAttempts: 1}, "passed"},
		{"passed on a retry", types.SpecReport{State: types.SpecStatePassed, NumAttempts: 3}, "passed (3 attempts)"},
		{"failed", types.SpecReport{State: types.SpecStateFailed, Failure: failure("\n\t boom \nsecond line")}, "failed: boom"},
		{"failed without message", types.SpecReport{State: types.SpecStateFailed}, "failed"},
		{"timed out", types.SpecReport{State: types.SpecStateTimedout, Failure: failure("A node timeout occurred")}, "timedout: A node timeout occurred"},
		{"panicked", types.SpecReport{State: types.SpecStatePanicked, Failure: failure("Test Panicked\nruntime error")}, "panicked: Test Panicked"},
		{"interrupted", types.SpecReport{State: types.SpecStateInterrupted, Failure: failure("interrupted by user")}, "interrupted: interrupted by user"},
		{"aborted", types.SpecReport{State: types.SpecStateAborted, Failure: failure("aborted")}, "aborted: aborted"},
		{"Skip called", types.SpecReport{State: types.SpecStateSkipped, Failure: failure("needs cgroup v2")}, "skipped: needs cgroup v2"},
		{"filtered out", types.SpecReport{State: types.SpecStateSkipped}, "not run"},
		{"pending", types.SpecReport{State: types.SpecStatePending}, "pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := result(tc.sr).String(); got != tc.want {
				t.Errorf("result = %q, want %q", got, tc.want)
			}
		})
	}
}

// row returns the comparison's rows with the text, in order.
func rowsWithText(c Comparison, text string) []Row {
	var out []Row
	for _, r := range c.Rows {
		if r.Text == text {
			out = append(out, r)
		}
	}
	return out
}

func TestCompare(t *testing.T) {
	c := Compare(loadFile(t, "stock.json"), loadFile(t, "fork.json"), loadReasons(t))
	type want struct{ stock, fork, reason string }
	for text, w := range map[string][]want{
		"[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]":   {{"passed", "passed (2 attempts)", ""}},
		"[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [NodeConformance]":                  {{"passed", "failed: file mode: expected -rw-r--r-- | got -rw------- <nil>", ""}},
		"[sig-storage] Projected secret should be consumable in multiple volumes in a pod [NodeConformance]": {{"passed", "timedout: A node timeout occurred", ""}},
		"[sig-storage] Downward API volume should update labels on modification [NodeConformance]":           {{"passed", "not run", ""}},
		"[sig-storage] HostPath when the path is a socket should give a volume the correct mode [NodeConformance]": {
			{"passed", "skipped: Spec skipped because an earlier spec in an ordered container failed", ""}},
		"[sig-storage] Secrets should be consumable from pods in volume [NodeConformance]": {{"passed", "not run", ""}},
		"[sig-node] Container Manager reads memory.max | memory.high on cgroup v2 [NodeConformance]": {
			{"skipped: the node runs cgroup v1, not v2", "skipped: the node runs cgroup v1, not v2", "the node mounts cgroup v1; the spec needs cgroup v2"}},
		"[sig-node] Kubelet when systemd is absent should restart the kubelet [NodeConformance]": {
			{`failed: exec: "systemctl": executable file not found in $PATH`, `failed: exec: "systemctl": executable file not found in $PATH`, "no systemd on the node: systemctl is missing"}},
		"[sig-storage] Volumes fails on both [NodeConformance]":                 {{"failed: Expected", "failed: Expected", ""}},
		"[sig-storage] Volumes is pending [NodeConformance]":                    {{"pending", "pending", ""}},
		"[sig-storage] Subpath should see a configMap update [NodeConformance]": {{"failed: Timed out after 300.001s.", "passed", ""}},
		"[sig-storage] Volumes has a twin [NodeConformance]": {
			{"passed", "failed: the second twin fails", ""}, {"failed: the first twin fails on stock", "passed", ""}}, // the regression first
		"[sig-storage] Volumes is outside the focus [Slow]": nil,
	} {
		rows := rowsWithText(c, text)
		var got []want
		for _, r := range rows {
			got = append(got, want{r.Stock.String(), r.Fork.String(), r.Reason})
		}
		if !slices.Equal(got, w) {
			t.Errorf("%s:\n got  %q\n want %q", text, got, w)
		}
	}
	if len(c.Rows) != 13 || c.NotRunEither != 1 {
		t.Errorf("%d rows and %d not run on either side, want 13 and 1", len(c.Rows), c.NotRunEither)
	}
	if got := rowsWithText(c, "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]")[0].Tags; !slices.Equal(got, []string{"Conformance", "NodeConformance", "sig-storage"}) {
		t.Errorf("tags %q", got)
	}
	if c.Stock.SuiteSucceeded || c.Fork.SuiteSucceeded {
		t.Errorf("suites succeeded: %v, %v; the fixtures say no", c.Stock.SuiteSucceeded, c.Fork.SuiteSucceeded)
	}
	wantSuite := []string{"Interrupted by User", "AfterSuite failed: failed to clean up the node: device or resource busy"}
	if len(c.Stock.SuiteFailures) != 0 || !slices.Equal(c.Fork.SuiteFailures, wantSuite) {
		t.Errorf("suite failures %q and %q, want none and %q", c.Stock.SuiteFailures, c.Fork.SuiteFailures, wantSuite)
	}
	var unused []string
	for _, r := range c.Unused {
		unused = append(unused, r.Substring)
	}
	if !slices.Equal(unused, []string{"EmptyDir volumes", "NodeSwap"}) {
		t.Errorf("unused reasons %q", unused)
	}
}

// TestCompareIgnoresReportOrder checks that the comparison does not depend
// on the order of the reports' specs, which is completion order in a
// parallel run: the twins (two specs of one text, one failing on each
// side) are matched by location, not by the order they finished in.
func TestCompareIgnoresReportOrder(t *testing.T) {
	stock, fork := loadFile(t, "stock.json"), loadFile(t, "fork.json")
	want := Compare(stock, fork, loadReasons(t))
	slices.Reverse(fork[0].SpecReports)
	if got := Compare(stock, fork, loadReasons(t)); !reflect.DeepEqual(got, want) {
		t.Errorf("reversed reports give\n%+v\nwant\n%+v", got.Rows, want.Rows)
	}
}

// TestRegressionsReported checks that every way a spec can pass on stock
// and not on the fork is reported, in the rows, the summary and first in
// the table.
func TestRegressionsReported(t *testing.T) {
	const text = "[sig-storage] Volumes should work [NodeConformance]"
	spec := func(state types.SpecState, msg string) types.SpecReport {
		sr := types.SpecReport{ContainerHierarchyTexts: []string{"[sig-storage] Volumes"}, LeafNodeType: types.NodeTypeIt,
			LeafNodeText: "should work [NodeConformance]", State: state, NumAttempts: 1}
		if msg != "" {
			sr.Failure = types.Failure{Message: msg, Location: types.CodeLocation{FileName: "v.go", LineNumber: 2}}
		}
		return sr
	}
	other := types.SpecReport{ContainerHierarchyTexts: []string{"[sig-storage] Volumes"}, LeafNodeType: types.NodeTypeIt,
		LeafNodeText: "a passing neighbour [NodeConformance]", State: types.SpecStatePassed, NumAttempts: 1}
	suite := func(specs ...types.SpecReport) []types.Report {
		return []types.Report{{SuiteDescription: "E2eNode Suite", SpecReports: specs}}
	}
	stock := suite(other, spec(types.SpecStatePassed, ""))
	for _, tc := range []struct {
		name string
		fork []types.Report
		want string
	}{
		{"failed", suite(other, spec(types.SpecStateFailed, "boom")), "failed: boom"},
		{"timed out", suite(other, spec(types.SpecStateTimedout, "A node timeout occurred")), "timedout: A node timeout occurred"},
		{"panicked", suite(other, spec(types.SpecStatePanicked, "Test Panicked")), "panicked: Test Panicked"},
		{"skipped", suite(other, spec(types.SpecStateSkipped, "no cgroup v2")), "skipped: no cgroup v2"},
		{"pending", suite(other, spec(types.SpecStatePending, "")), "pending"},
		{"filtered out", suite(other, spec(types.SpecStateSkipped, "")), "not run"},
		{"absent", suite(other), "not run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A reason for the spec must not hide a regression.
			c := Compare(stock, tc.fork, Reasons{{Substring: "should work", Text: "excuse"}})
			s := c.Summary()
			if len(s.Regressions) != 1 || s.Regressions[0] != (Change{Spec: text, Stock: "passed", Fork: tc.want}) {
				t.Fatalf("regressions %+v, want %q passed on stock and %q on the fork", s.Regressions, text, tc.want)
			}
			if c.Rows[0].Text != text || c.Rows[0].Reason != "" {
				t.Errorf("first row %+v, want the regression without a reason", c.Rows[0])
			}
			var md bytes.Buffer
			if err := WriteMarkdown(&md, c); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(md.String(), "## Regressions: pass on stock, not on the fork (1)\n\n- "+text+": fork "+cell(tc.want)+"\n") {
				t.Errorf("the table does not list the regression:\n%s", md.String())
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		for _, fork := range [][]types.Report{stock, suite(spec(types.SpecStatePassed, ""), other)} {
			if s := Compare(stock, fork, nil).Summary(); len(s.Regressions) != 0 {
				t.Errorf("regressions %+v, want none", s.Regressions)
			}
		}
	})
}

// TestGolden renders the fixtures' comparison as Markdown and JSON and
// compares them with testdata/comparison.md and testdata/summary.json
// (go test -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	c := Compare(loadFile(t, "stock.json"), loadFile(t, "fork.json"), loadReasons(t))
	var md bytes.Buffer
	if err := WriteMarkdown(&md, c); err != nil {
		t.Fatal(err)
	}
	var summary bytes.Buffer
	if err := WriteSummary(&summary, c); err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string][]byte{"comparison.md": md.Bytes(), "summary.json": summary.Bytes()} {
		path := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs (go test -run TestGolden -update rewrites it); got:\n%s", path, got)
		}
	}
}

func TestParseReasons(t *testing.T) {
	rs, err := ParseReasons(strings.NewReader("# comment\n\n  cgroup v1 =>  needs v2 \nsystemd => no systemd => really\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Reasons{{"cgroup v1", "needs v2", 3}, {"systemd", "no systemd => really", 4}}
	if !slices.Equal(rs, want) {
		t.Errorf("ParseReasons = %+v, want %+v", rs, want)
	}
	if i := rs.match("a [sig-node] systemd spec on cgroup v1"); i != 0 {
		t.Errorf("match = %d, want the first matching line, 0", i)
	}
	for _, in := range []string{"no separator", " => a reason", "a substring => ", "x => one\nx => two"} {
		if _, err := ParseReasons(strings.NewReader(in)); err == nil {
			t.Errorf("ParseReasons(%q) succeeded, want an error", in)
		}
	}
}

// TestCompareShards: the reports of a suite run in parts (each listing
// the other parts' specs as not run) compare as the whole run does.
func TestCompareShards(t *testing.T) {
	stock, fork := loadFile(t, "stock.json"), loadFile(t, "fork.json")
	want := Compare(stock, fork, loadReasons(t))
	split := func(reports []types.Report) []types.Report {
		var parts []types.Report
		for part := range 2 {
			for _, r := range reports {
				r.SpecReports = slices.Clone(r.SpecReports)
				for i := range r.SpecReports {
					if r.SpecReports[i].LeafNodeType == types.NodeTypeIt && i%2 != part {
						r.SpecReports[i] = types.SpecReport{LeafNodeType: types.NodeTypeIt, State: types.SpecStateSkipped,
							ContainerHierarchyTexts: r.SpecReports[i].ContainerHierarchyTexts, LeafNodeText: r.SpecReports[i].LeafNodeText,
							LeafNodeLocation: r.SpecReports[i].LeafNodeLocation, LeafNodeLabels: r.SpecReports[i].LeafNodeLabels}
					}
				}
				parts = append(parts, r)
			}
		}
		return parts
	}
	if got := Compare(split(stock), split(fork), loadReasons(t)); !reflect.DeepEqual(got.Rows, want.Rows) || !reflect.DeepEqual(got.Stock.Counts, want.Stock.Counts) {
		t.Errorf("the parts give\n%+v\nwant\n%+v", got.Rows, want.Rows)
	}
}

// TestCompareRerun: a later report that ran a spec again (a rerun, listing
// every other spec as not run) gives that spec its result; an earlier
// result stands where the later report did not run the spec.
func TestCompareRerun(t *testing.T) {
	stock, fork := loadFile(t, "stock.json"), loadFile(t, "fork.json")
	before := Compare(stock, fork, loadReasons(t))
	// A failed spec whose text no other spec shares (twins, numbered,
	// would rerun together).
	n := map[string]int{}
	for _, r := range before.Rows {
		n[r.Text]++
	}
	failed := slices.IndexFunc(before.Rows, func(r Row) bool { return r.Stock.Outcome == Failed && n[r.Text] == 1 })
	if failed < 0 {
		t.Fatal("testdata/stock.json has no failed spec of a text of its own")
	}
	rerun := func(reports []types.Report, text string) []types.Report {
		var out []types.Report
		for _, r := range reports {
			r.SpecReports = slices.Clone(r.SpecReports)
			for i, sr := range r.SpecReports {
				if sr.LeafNodeType != types.NodeTypeIt {
					continue
				}
				if sr.FullText() == text {
					r.SpecReports[i].State, r.SpecReports[i].Failure = types.SpecStatePassed, types.Failure{}
				} else {
					r.SpecReports[i] = types.SpecReport{LeafNodeType: types.NodeTypeIt, State: types.SpecStateSkipped,
						ContainerHierarchyTexts: sr.ContainerHierarchyTexts, LeafNodeText: sr.LeafNodeText,
						LeafNodeLocation: sr.LeafNodeLocation, LeafNodeLabels: sr.LeafNodeLabels}
				}
			}
			out = append(out, r)
		}
		return out
	}
	text := before.Rows[failed].Text
	got := Compare(append(slices.Clone(stock), rerun(stock, text)...), fork, loadReasons(t))
	was := map[string][]Result{}
	for _, r := range before.Rows {
		was[r.Text] = append(was[r.Text], r.Stock)
	}
	for _, r := range got.Rows {
		want := was[r.Text][0]
		was[r.Text] = was[r.Text][1:]
		if r.Text == text {
			want = Result{Outcome: Passed}
		}
		if !reflect.DeepEqual(r.Stock, want) {
			t.Errorf("%s: stock %+v after the rerun, want %+v", r.Text, r.Stock, want)
		}
	}
}
