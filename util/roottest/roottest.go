// Package roottest gates tests that need root (real mounts, loop devices).
package roottest

import (
	"os"
	"testing"
)

// Require skips t when the process is not root, with a message saying why.
// Under CI (CI=true) or with NODEVOL_REQUIRE_ROOT=1 it fails instead, so that
// a CI run can never pass by skipping the tests that matter.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" || os.Getenv("NODEVOL_REQUIRE_ROOT") == "1" {
		t.Fatalf("%s needs root (real mounts and loop devices), and CI must run it", t.Name())
	}
	t.Skipf("%s needs root (real mounts and loop devices): skipped as uid %d", t.Name(), os.Geteuid())
}
