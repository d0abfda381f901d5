package kubelettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Command is a Go command a test runs as a process, built once per test
// binary: Path builds it the first time, into a directory of its own that
// Remove removes (from TestMain, after m.Run).
type Command struct {
	// Dir is the directory of the module to build in, relative to the
	// test's working directory (its package's directory).
	Dir string
	// Pkg is the package to build, as go build names it
	// ("./examples/nodeagent").
	Pkg string
	// Flags are go build's flags. Unset: none. -trimpath shares the
	// compiled packages with a make target that builds the same command
	// with it.
	Flags []string

	once sync.Once
	tmp  string
	path string
	err  error
}

// Path returns the built command's path, building it first if this test
// binary has not; a failed build fails tb, with the compiler's output.
func (c *Command) Path(tb testing.TB) string {
	tb.Helper()
	c.once.Do(func() {
		if c.tmp, c.err = os.MkdirTemp("", "nodevol-bin-"); c.err != nil {
			return
		}
		c.path = filepath.Join(c.tmp, filepath.Base(c.Pkg))
		cmd := exec.Command("go", append(append([]string{"build"}, c.Flags...), "-o", c.path, c.Pkg)...)
		cmd.Dir = c.Dir
		if out, err := cmd.CombinedOutput(); err != nil {
			c.err = fmt.Errorf("building %s: %w\n%s", c.Pkg, err, out)
		}
	})
	if c.err != nil {
		tb.Fatal(c.err)
	}
	return c.path
}

// Remove removes what Path built, if anything.
func (c *Command) Remove() {
	if c.tmp != "" {
		_ = os.RemoveAll(c.tmp)
	}
}
