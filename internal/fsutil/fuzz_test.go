package fsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidateName checks that a name ValidateName accepts, joined to a
// root, names an entry directly inside the root: never the root itself,
// never outside it, never deeper.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"a", ".", "..", "../x", "a/b", "a\x00", "...", "./", "x/..", "/", ""} {
		f.Add(s)
	}
	const root = "/var/lib/kubelet/pods"
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateName("spec name", name) != nil {
			return
		}
		joined := filepath.Join(root, name)
		if filepath.Dir(joined) != root {
			t.Fatalf("accepted %q, which joined to %s gives %s", name, root, joined)
		}
		if filepath.Base(joined) != name {
			t.Fatalf("accepted %q, which filepath.Join rewrites to %s", name, joined)
		}
		rel, err := filepath.Rel(root, joined)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("accepted %q, which escapes %s (rel %q)", name, root, rel)
		}
	})
}

// FuzzReadJSON checks that ReadJSON never panics on any file content and
// that whatever it accepts round-trips through WriteJSONAtomic.
func FuzzReadJSON(f *testing.F) {
	for _, s := range []string{`{"a":"x","b":1}`, `{`, `null`, `[]`, `{"a":1}`, "\x00", `{"a":"x"}{"a":"y"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "vol_data.json")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		var v map[string]string
		if err := ReadJSON(path, &v); err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if err := WriteJSONAtomic(path, v, 0o600); err != nil {
			t.Fatal(err)
		}
		var again map[string]string
		if err := ReadJSON(path, &again); err != nil {
			t.Fatalf("re-reading what was written: %v", err)
		}
		if len(again) != len(v) {
			t.Fatalf("round trip changed %v into %v", v, again)
		}
	})
}
