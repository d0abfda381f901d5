package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// StartT starts an environment for test t (Start with t.Context()) and
// registers its Stop with t.Cleanup; when t has failed, the cleanup first
// logs the tail of both processes' logs.
//
// It skips t under -short, and when a binary is missing (ErrBinaryMissing),
// with a message that says how to build it; under CI (CI=true) or with
// NODEVOL_REQUIRE_TESTENV=1 a missing binary fails t instead, so that a CI
// run cannot pass by skipping. Any other error fails t.
func StartT(t testing.TB, opts Options) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("testenv: skipped under -short (starts etcd and kube-apiserver)")
	}
	env, err := Start(t.Context(), opts)
	if err != nil {
		fail, msg := verdict(err, os.Getenv)
		if fail {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(env.logTails(30))
		}
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env
}

// verdict decides StartT's outcome for Start's error: skip with msg, or fail
// with msg.
func verdict(err error, getenv func(string) string) (fail bool, msg string) {
	switch {
	case !errors.Is(err, ErrBinaryMissing):
		return true, err.Error()
	case getenv("CI") == "true" || getenv("NODEVOL_REQUIRE_TESTENV") == "1":
		return true, fmt.Sprintf("%v (CI=true or NODEVOL_REQUIRE_TESTENV=1: the test environment is required)", err)
	default:
		return false, fmt.Sprintf("skipped: %v", err)
	}
}
