package planner

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestNoIO keeps the planner pure: its non-test files import only data
// types (the caches, the executor's actions and backoff entries, API
// types) and standard packages that do no I/O and read no clock.
func TestNoIO(t *testing.T) {
	allowed := map[string]bool{
		"cmp": true, "errors": true, "fmt": true, "maps": true, "slices": true, "sort": true, "strings": true, "time": true,
		"github.com/nodevol/nodevol/podvol":                                   true,
		"github.com/nodevol/nodevol/volumemanager/internal/state":             true,
		"github.com/nodevol/nodevol/volumemanager/internal/operationexecutor": true,
		"github.com/nodevol/nodevol/volume":                                   true, // its non-test files do no I/O
		"k8s.io/api/core/v1":                                                  true,
		"k8s.io/api/storage/v1":                                               true,
		"k8s.io/apimachinery/pkg/api/resource":                                true,
		"k8s.io/apimachinery/pkg/types":                                       true,
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, clock := range []string{"time.Now(", "time.Since(", "time.Until(", "time.After"} {
			if strings.Contains(string(src), clock) {
				t.Errorf("%s calls %s: the planner is given the time (View.Now)", name, clock)
			}
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowed[path] {
				t.Errorf("%s imports %s: the planner imports data types only", name, path)
			}
		}
	}
}
