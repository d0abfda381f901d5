package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string
	}{
		{name: "csi.example.com"},
		{name: "pvc-0a1b2c"},
		{name: "a..b"},
		{name: "...", wantErr: ""},
		{name: strings.Repeat("a", MaxNameLength)},
		{name: "", wantErr: "must not be empty"},
		{name: ".", wantErr: `must not be "."`},
		{name: "..", wantErr: `must not be ".."`},
		{name: "a/b", wantErr: `must not contain "/"`},
		{name: "/", wantErr: `must not contain "/"`},
		{name: "../etc", wantErr: `must not contain "/"`},
		{name: "a\x00b", wantErr: "NUL"},
		{name: strings.Repeat("a", MaxNameLength+1), wantErr: "longer than"},
	}
	for _, tt := range tests {
		err := ValidateName("driver name", tt.name)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("ValidateName(%q) = %v, want nil", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "invalid driver name") {
			t.Errorf("ValidateName(%q) = %v, want an error about the driver name containing %q", tt.name, err, tt.wantErr)
		}
	}
}

type data struct {
	A string `json:"a"`
	B int    `json:"b"`
}

func TestWriteReadJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vol_data.json")
	if err := WriteJSONAtomic(path, data{A: "x", B: 1}, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSONAtomic(path, data{A: "y", B: 2}, 0o640); err != nil {
		t.Fatal(err)
	}
	var got data
	if err := ReadJSON(path, &got); err != nil {
		t.Fatal(err)
	}
	if got != (data{A: "y", B: 2}) {
		t.Errorf("ReadJSON = %+v", got)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temporary files left)", len(entries))
	}
}

func TestWriteJSONAtomicErrors(t *testing.T) {
	dir := t.TempDir()
	if err := WriteJSONAtomic(filepath.Join(dir, "missing", "f.json"), data{}, 0o600); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	if err := WriteJSONAtomic(filepath.Join(dir, "f.json"), make(chan int), 0o600); err == nil {
		t.Error("writing an unencodable value succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("failed writes left %d entries behind", len(entries))
	}
}

func TestReadJSONErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		corrupt bool
	}{
		{name: "missing", path: filepath.Join(dir, "nope.json")},
		{name: "truncated", path: write("trunc.json", `{"a":"x`), corrupt: true},
		{name: "trailing junk", path: write("junk.json", `{"a":"x"} {}`), corrupt: true},
		{name: "wrong type", path: write("type.json", `{"b":"x"}`), corrupt: true},
		{name: "empty", path: write("empty.json", ``), corrupt: true},
		{name: "too big", path: write("big.json", `"`+strings.Repeat("a", MaxJSONSize)+`"`), corrupt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v data
			err := ReadJSON(tt.path, &v)
			if err == nil {
				t.Fatal("ReadJSON succeeded")
			}
			if !strings.Contains(err.Error(), tt.path) {
				t.Errorf("error %q does not name the file", err)
			}
			if got := errors.Is(err, ErrCorrupt); got != tt.corrupt {
				t.Errorf("errors.Is(err, ErrCorrupt) = %v, want %v (err: %v)", got, tt.corrupt, err)
			}
			if !tt.corrupt && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("missing file: err %v does not wrap fs.ErrNotExist", err)
			}
		})
	}
}
