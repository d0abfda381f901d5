package roottest

import (
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name   string
		short  bool
		euid   int
		getenv func(string) string
		fail   bool
		msg    string // a part of the message; empty: the test runs
	}{
		{name: "root", euid: 0, getenv: env()},
		{name: "root under CI", euid: 0, getenv: env("CI", "true")},
		{name: "non-root", euid: 1000, getenv: env(), msg: "skipped as uid 1000"},
		{name: "non-root under CI", euid: 1000, getenv: env("CI", "true"), fail: true, msg: "CI must run it"},
		{name: "non-root, root required", euid: 1000, getenv: env("NODEVOL_REQUIRE_ROOT", "1"), fail: true, msg: "CI must run it"},
		{name: "non-root, CI not true", euid: 1000, getenv: env("CI", "1"), msg: "skipped as uid 1000"},
		{name: "short as root", short: true, euid: 0, getenv: env(), msg: "skipped under -short"},
		{name: "short as non-root under CI", short: true, euid: 1000, getenv: env("CI", "true", "NODEVOL_REQUIRE_ROOT", "1"), msg: "skipped under -short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fail, msg := verdict("TestX", tc.short, tc.euid, tc.getenv)
			if fail != tc.fail || (tc.msg == "") != (msg == "") || !strings.Contains(msg, tc.msg) {
				t.Errorf("verdict = %v, %q; want %v and a message containing %q", fail, msg, tc.fail, tc.msg)
			}
			if msg != "" && !strings.HasPrefix(msg, "TestX needs root") {
				t.Errorf("message %q does not name the test", msg)
			}
		})
	}
}

func TestRequireSkipsUnderShort(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks Require under -short; run with -short")
	}
	ran := false
	t.Run("gated", func(t *testing.T) {
		Require(t)
		ran = true
	})
	if ran {
		t.Error("Require did not skip under -short")
	}
}
