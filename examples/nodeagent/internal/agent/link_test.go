package agent

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// reflectMethodPackages are packages that look methods up by a name known
// only at run time (reflect.Value.MethodByName): linked in, they make the
// linker keep every exported method of every type the binary converts to
// an interface, client-go's and k8s.io/api's included. x/net/trace (gRPC's
// request tracing) linked html/template into the agent: 28 MB of text and
// 24 MB of function tables where 17 and 12 do
// (docs/perf/2026-11-30-agent-memory.md).
var reflectMethodPackages = []string{"text/template", "html/template"}

// TestAgentLinksNoTemplate: the agent, built with the tags of the
// Makefile's NODEAGENT_TAGS (grpcnotrace: gRPC without x/net/trace), links
// no package that keeps every exported method alive.
func TestAgentLinksNoTemplate(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	tags := makefileTags(t, filepath.Join("..", "..", "..", "..", "Makefile"))
	if tags == "" {
		t.Fatal("the Makefile's NODEAGENT_TAGS is empty: the agent would link gRPC's x/net/trace and html/template")
	}
	cmd := exec.Command("go", "list", "-tags", tags, "-deps", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}",
		"github.com/nodevol/nodevol/examples/nodeagent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ": ")
		for _, imp := range strings.Fields(imports) {
			for _, bad := range reflectMethodPackages {
				if imp == bad {
					t.Errorf("the agent (-tags %s) links %s, imported by %s: the linker then keeps every exported method", tags, bad, pkg)
				}
			}
		}
	}
}

var makefileTagsLine = regexp.MustCompile(`^NODEAGENT_TAGS\s*\??=\s*(.*)$`)

// makefileTags is the value of NODEAGENT_TAGS in the Makefile at path.
func makefileTags(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := makefileTagsLine.FindStringSubmatch(sc.Text()); m != nil {
			return strings.TrimSpace(m[1])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("%s: no NODEAGENT_TAGS", path)
	return ""
}
