package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionsMatchBuildModule keeps KubernetesVersion and EtcdVersion equal
// to what testenv/build builds, so that DefaultBinDir is keyed right.
func TestVersionsMatchBuildModule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("build", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"k8s.io/kubernetes " + kubernetesVersion, "go.etcd.io/etcd/server/v3 " + etcdVersion} {
		if !strings.Contains(string(b), "\t"+want) {
			t.Errorf("build/go.mod does not require %s", want)
		}
	}
}

func TestLocate(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "etcd")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "kube-apiserver")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envEtcd, "")
	t.Setenv(envAPIServer, "")

	if got, err := locate("etcd", "", envEtcd, dir); err != nil || got != exe {
		t.Errorf("locate from the bin dir = %q, %v; want %q", got, err, exe)
	}
	t.Setenv(envEtcd, exe)
	if got, err := locate("etcd", "", envEtcd, "/nonexistent"); err != nil || got != exe {
		t.Errorf("locate from $%s = %q, %v; want %q", envEtcd, got, err, exe)
	}
	_, err := locate("kube-apiserver", "", envAPIServer, "/nonexistent")
	if !errors.Is(err, ErrBinaryMissing) || !strings.Contains(err.Error(), "make testenv-bins") ||
		!strings.Contains(err.Error(), "/nonexistent/kube-apiserver") {
		t.Errorf("missing binary: %v; want ErrBinaryMissing naming the path and make testenv-bins", err)
	}
	if _, err := locate("kube-apiserver", plain, envAPIServer, ""); err == nil || errors.Is(err, ErrBinaryMissing) {
		t.Errorf("non-executable file: %v; want an error that is not ErrBinaryMissing", err)
	}
}

func TestOptionsUsers(t *testing.T) {
	for _, users := range [][]User{{{Name: ""}}, {{Name: "a"}, {Name: "a"}}, {{Name: adminName}}} {
		if _, err := (Options{Users: users}).withDefaults(); err == nil || errors.Is(err, ErrBinaryMissing) {
			t.Errorf("Users %v: %v, want a validation error", users, err)
		}
	}
}

func TestVerdict(t *testing.T) {
	missing := fmt.Errorf("x: %w", ErrBinaryMissing)
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		err  error
		env  func(string) string
		fail bool
	}{
		{missing, env(), false},
		{missing, env("CI", "true"), true},
		{missing, env("NODEVOL_REQUIRE_TESTENV", "1"), true},
		{errors.New("kube-apiserver exited"), env(), true},
	} {
		if fail, msg := verdict(c.err, c.env); fail != c.fail || msg == "" {
			t.Errorf("verdict(%v) = %v, %q; want fail=%v", c.err, fail, msg, c.fail)
		}
	}
}
