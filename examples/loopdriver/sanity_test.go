package main

import (
	"context"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
)

// findCSISanity finds the csi-sanity binary: $CSI_SANITY, then
// bin/csi-sanity at the module root (where `make tools` puts it), then
// PATH. Missing, it fails under CI and skips otherwise.
func findCSISanity(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CSI_SANITY"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if out, err := exec.Command("go", "env", "GOMOD").Output(); err == nil {
		p := filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "bin", "csi-sanity")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("csi-sanity"); err == nil {
		return p
	}
	msg := "csi-sanity not found ($CSI_SANITY, bin/csi-sanity, PATH): run `make tools`"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// junitReport is the part of a Ginkgo JUnit report the test reads.
type junitReport struct {
	Cases []struct {
		Name    string `xml:"name,attr"`
		Status  string `xml:"status,attr"`
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
		Failure *struct {
			Message string `xml:"message,attr"`
			Body    string `xml:",chardata"`
		} `xml:"failure"`
	} `xml:"testsuite>testcase"`
}

// TestCSISanity runs kubernetes-csi's csi-sanity against the driver as
// a separate process, once with mount and once with block access, and
// then checks that no loop device or mount is left behind.
func TestCSISanity(t *testing.T) {
	roottest.Require(t)
	sanity := findCSISanity(t)
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) {
			dir := csitest.SocketDir(t)
			sock := filepath.Join(dir, "csi.sock")
			// A low volume limit lets csi-sanity's attach-limit spec run
			// without publishing dozens of volumes.
			drv := startDriver(t, sock, filepath.Join(dir, "state"), "--max-volumes", "4")
			report := filepath.Join(dir, "report.xml")
			mutable := filepath.Join(dir, "mutable.yaml")
			if err := os.WriteFile(mutable, []byte("description: sanity\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, sanity,
				"--csi.endpoint", sock,
				"--csi.mountdir", filepath.Join(dir, "target"),
				"--csi.stagingdir", filepath.Join(dir, "staging"),
				"--csi.testvolumeaccesstype", access,
				"--csi.testnodevolumeattachlimit",
				"--csi.testvolumemutableparameters", mutable,
				"--ginkgo.junit-report", report,
				"--ginkgo.no-color",
			)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("csi-sanity timed out:\n%s", tail(out, 60))
			}
			passed, failed, skipped := summarize(t, report)
			if err != nil && failed == 0 {
				t.Errorf("csi-sanity failed without a failed spec: %v\n%s", err, tail(out, 60))
			}
			if failed > 0 {
				t.Errorf("csi-sanity: %d specs failed", failed)
			}
			drv.stop(t)
			checkNoLeaks(t, dir)
			t.Logf("csi-sanity (%s): %d passed, %d failed, %d skipped", access, passed, failed, skipped)
		})
	}
}

// summarize parses the JUnit report, logs failures and skip reasons and
// returns the counts.
func summarize(t *testing.T, path string) (passed, failed, skipped int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading csi-sanity report: %v", err)
	}
	var r junitReport
	if err := xml.Unmarshal(data, &r); err != nil {
		t.Fatalf("parsing csi-sanity report %s: %v", path, err)
	}
	reasons := map[string]int{}
	for _, c := range r.Cases {
		switch {
		case c.Failure != nil || c.Status == "failed" || c.Status == "panicked":
			failed++
			msg := c.Status
			if c.Failure != nil {
				msg = c.Failure.Message + "\n" + c.Failure.Body
			}
			t.Errorf("FAILED %s:\n%s", c.Name, msg)
		case c.Status == "passed":
			passed++
		case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
			skipped++
			reason := c.Status
			if c.Skipped != nil && c.Skipped.Message != "" {
				reason = strings.TrimPrefix(c.Skipped.Message, "skipped - ")
			}
			reasons[reason]++
		}
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("skipped %2d: %s", reasons[k], k)
	}
	return passed, failed, skipped
}

// tail returns the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(string(out), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
