// Package roottest gates tests that need root (real mounts, loop devices).
package roottest

import (
	"fmt"
	"os"
	"testing"
)

// Require skips t when the process is not root, with a message saying why.
// Under CI (CI=true) or with NODEVOL_REQUIRE_ROOT=1 it fails instead, so that
// a CI run can never pass by skipping the tests that matter.
//
// With -short it always skips, even as root and under CI: -short asks for
// the fast tests only (make unit), and CI runs the full suite without it
// (make test).
func Require(t testing.TB) {
	t.Helper()
	fail, msg := verdict(t.Name(), testing.Short(), os.Geteuid(), os.Getenv)
	switch {
	case fail:
		t.Fatal(msg)
	case msg != "":
		t.Skip(msg)
	}
}

// verdict decides Require's outcome for test name: run (msg empty), skip
// with msg, or fail with msg.
func verdict(name string, short bool, euid int, getenv func(string) string) (fail bool, msg string) {
	switch {
	case short:
		return false, fmt.Sprintf("%s needs root (real mounts and loop devices): skipped under -short", name)
	case euid == 0:
		return false, ""
	case getenv("CI") == "true" || getenv("NODEVOL_REQUIRE_ROOT") == "1":
		return true, fmt.Sprintf("%s needs root (real mounts and loop devices), and CI must run it", name)
	default:
		return false, fmt.Sprintf("%s needs root (real mounts and loop devices): skipped as uid %d", name, euid)
	}
}
