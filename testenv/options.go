package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The versions make testenv-bins builds (testenv/build/go.mod pins them).
const (
	// kubernetesVersion is the version of kube-apiserver; defaultBinDir is
	// keyed by it.
	kubernetesVersion = "v1.37.2"
	// etcdVersion is the version of etcd that k8s.io/kubernetes
	// kubernetesVersion selects.
	etcdVersion = "v3.7.0"
)

// Environment variables that locate the binaries when Options leaves them
// unset.
const (
	// envAPIServer names the kube-apiserver binary.
	envAPIServer = "NODEVOL_TESTENV_APISERVER"
	// envEtcd names the etcd binary.
	envEtcd = "NODEVOL_TESTENV_ETCD"
	// envBinDir names the directory holding both binaries.
	envBinDir = "NODEVOL_TESTENV_DIR"
)

// buildHint is how to get the binaries, quoted in errors.
const buildHint = "build both with `make testenv-bins` in the nodevol repository (module testenv/build), " +
	"or set " + envAPIServer + " and " + envEtcd

// ErrBinaryMissing is wrapped by Start's error when kube-apiserver or etcd
// cannot be found; StartT skips on it outside CI.
var ErrBinaryMissing = errors.New("testenv binary missing")

// User is an identity that a test authenticates as.
type User struct {
	// Name is the user name, for example "alice" or "system:node:node-1".
	// Required.
	Name string
	// Groups are the user's groups, for example "system:nodes". Unset: none
	// (the apiserver adds system:authenticated).
	Groups []string
}

// Options configures Start. The zero value is valid: every field says what
// happens when it is unset.
type Options struct {
	// APIServerPath is the kube-apiserver binary. Unset:
	// $NODEVOL_TESTENV_APISERVER, then {BinDir}/kube-apiserver.
	APIServerPath string
	// EtcdPath is the etcd binary. Unset: $NODEVOL_TESTENV_ETCD, then
	// {BinDir}/etcd.
	EtcdPath string
	// BinDir is the directory both binaries are looked for in. Unset:
	// $NODEVOL_TESTENV_DIR, then make testenv-bins' directory
	// ($XDG_CACHE_HOME/nodevol-testenv/v1.37.2, or ~/.cache/...).
	BinDir string

	// Users get a static bearer token each, besides the admin; TokenConfig
	// returns a config for one of them. Names must be unique and differ
	// from AdminName. Unset: only the admin.
	Users []User
	// AuthorizationModes is kube-apiserver's --authorization-mode, in order,
	// for example {"Node", "RBAC"}. Unset: {"RBAC"}. The admin is in
	// system:masters, which every mode but AlwaysDeny lets through.
	AuthorizationModes []string
	// EnableAdmissionPlugins are turned on besides the apiserver's default
	// ones, for example {"NodeRestriction"}. Unset: the defaults only.
	EnableAdmissionPlugins []string
	// DisableAdmissionPlugins are turned off. Unset: {"ServiceAccount"} (see
	// the package doc); set to an empty non-nil slice to keep it on.
	DisableAdmissionPlugins []string
	// APIServerArgs are appended to kube-apiserver's command line, after
	// testenv's own flags (a repeated flag takes its last value). Unset:
	// none.
	APIServerArgs []string
	// EtcdArgs are appended to etcd's command line. Unset: none.
	EtcdArgs []string

	// StartTimeout bounds each process's start, from launch to ready (etcd
	// healthy, kube-apiserver's /readyz ok), within the caller's context.
	// Unset: 60 seconds.
	StartTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before it kills a
	// process. Unset: 10 seconds.
	StopTimeout time.Duration
}

// adminName is the user name of Env.Config's token, a member of
// system:masters.
const adminName = "testenv-admin"

// defaultBinDir is where make testenv-bins puts the binaries:
// $XDG_CACHE_HOME/nodevol-testenv/{kubernetesVersion}, or
// ~/.cache/nodevol-testenv/{kubernetesVersion} when XDG_CACHE_HOME is unset.
// It returns "" when neither that nor the home directory is known.
func defaultBinDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "nodevol-testenv", kubernetesVersion)
}

// withDefaults returns o with every unset field defaulted and the binaries
// located, or an error naming the field that is invalid or the binary that
// is missing (wrapping ErrBinaryMissing).
func (o Options) withDefaults() (Options, error) {
	if o.BinDir == "" {
		o.BinDir = os.Getenv(envBinDir)
	}
	if o.BinDir == "" {
		o.BinDir = defaultBinDir()
	}
	if o.AuthorizationModes == nil {
		o.AuthorizationModes = []string{"RBAC"}
	}
	if o.DisableAdmissionPlugins == nil {
		o.DisableAdmissionPlugins = []string{"ServiceAccount"}
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 10 * time.Second
	}
	seen := map[string]bool{adminName: true}
	for i, u := range o.Users {
		if u.Name == "" {
			return o, fmt.Errorf("testenv: Options.Users[%d]: empty name", i)
		}
		if seen[u.Name] {
			return o, fmt.Errorf("testenv: Options.Users[%d]: user %q given twice or reserved", i, u.Name)
		}
		seen[u.Name] = true
	}
	var err error
	if o.APIServerPath, err = locate("kube-apiserver", o.APIServerPath, envAPIServer, o.BinDir); err != nil {
		return o, err
	}
	if o.EtcdPath, err = locate("etcd", o.EtcdPath, envEtcd, o.BinDir); err != nil {
		return o, err
	}
	return o, nil
}

// locate finds binary name: the path given, else the environment variable
// env, else binDir/name. It checks that the file is an executable.
func locate(name, path, env, binDir string) (string, error) {
	from := "the Options field"
	if path == "" && os.Getenv(env) != "" {
		path, from = os.Getenv(env), "$"+env
	}
	if path == "" {
		if binDir == "" {
			return "", fmt.Errorf("testenv: %s: %w: no path set and no cache directory known; %s", name, ErrBinaryMissing, buildHint)
		}
		path, from = filepath.Join(binDir, name), "the cache directory"
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("testenv: %s: %w: %s (from %s): %v; %s", name, ErrBinaryMissing, path, from, err, buildHint)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("testenv: %s: %s (from %s) is not an executable file", name, path, from)
	}
	return path, nil
}
