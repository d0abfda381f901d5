package volumemanager_test

import (
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	// goTestExamples is a command the docs give to run a package's
	// examples.
	goTestExamples = regexp.MustCompile("`go test -run Example (\\./[\\w/]+)`")
	// namedExample is an example function the docs name.
	namedExample = regexp.MustCompile("`(Example\\w*)`")
	// goDoc is a go doc command.
	goDoc = regexp.MustCompile("`go doc [^`]*`")
)

// TestREADMEExamplesRun checks what README.md and docs/*.md say about the
// examples: every package whose examples a `go test -run Example ./pkg`
// command runs has examples, each with an Output comment (so that the
// command runs and checks it rather than only compiling it); every
// example named is one of those; no `go doc` command is given for an
// example, since go doc prints none.
func TestREADMEExamplesRun(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append([]string{"../README.md"}, docs...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ") // commands wrap across lines
		for _, cmd := range goDoc.FindAllString(text, -1) {
			if strings.Contains(cmd, "Example") {
				t.Errorf("%s: %s: go doc prints no examples", path, cmd)
			}
		}
		var runnable []string
		for _, m := range goTestExamples.FindAllStringSubmatch(text, -1) {
			runnable = append(runnable, checkedExamples(t, path, filepath.Join("..", m[1]))...)
		}
		for _, m := range namedExample.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(runnable, m[1]) {
				t.Errorf("%s names %s, which no `go test -run Example ./pkg` command of it runs (it runs %v)", path, m[1], runnable)
			}
		}
	}
}

// checkedExamples returns the names of the examples of the package in dir,
// failing t unless there is at least one and each has an Output comment.
func checkedExamples(t *testing.T, docPath, dir string) []string {
	t.Helper()
	tests, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, path := range tests {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, ex := range doc.Examples(f) {
			name := "Example" + ex.Name // Name is the function's without the prefix
			if ex.Output == "" && !ex.EmptyOutput {
				t.Errorf("%s: %s in %s has no Output comment: go test compiles it but does not run it", docPath, name, path)
			}
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Errorf("%s: go test -run Example %s: the package has no examples", docPath, dir)
	}
	return names
}
