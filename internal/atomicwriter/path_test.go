package atomicwriter

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestValidatePath(t *testing.T) {
	long := strings.Repeat("a", 256)
	for _, tc := range []struct {
		path, err string
	}{
		{path: "a"},
		{path: "a/b/c"},
		{path: "a/..b"},
		{path: "..", err: "must not contain '..'"},
		{path: ".a"},
		{path: "a//b"},
		{path: "./a"},
		{path: "", err: `must not be empty: ""`},
		{path: "/a", err: "must be relative path: /a"},
		{path: "a/../b", err: "must not contain '..': a/../b"},
		{path: "..a", err: "must not start with '..': ..a"},
		{path: "..data", err: "must not start with '..': ..data"},
		{path: "..data/x", err: "must not start with '..'"},
		{path: long, err: "filenames must be less than or equal to 255 characters"},
		{path: strings.Repeat("a/", 2049), err: "must be less than or equal to 4096 characters"},
		{path: ".", err: "must name a file"},
		{path: "./.", err: "must name a file"},
		{path: "a/."},
	} {
		err := ValidatePath(tc.path)
		if tc.err == "" {
			if err != nil {
				t.Errorf("ValidatePath(%q) = %v, want nil", tc.path, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "invalid path: ") {
			t.Errorf("ValidatePath(%q) = %v, want %q", tc.path, err, tc.err)
		}
	}
}

func TestCleanPayload(t *testing.T) {
	for _, tc := range []struct {
		name     string
		paths    []string
		want     []string
		conflict bool
	}{
		{name: "sorted and cleaned", paths: []string{"b", "a//c/", "./d"}, want: []string{"a/c", "b", "d"}},
		{name: "siblings sharing a prefix", paths: []string{"a", "a-b", "a.b", "ab/c"}, want: []string{"a", "a-b", "a.b", "ab/c"}},
		{name: "same after cleaning", paths: []string{"a/b", "a//b"}, conflict: true},
		{name: "file and directory", paths: []string{"a", "a-x", "a/b"}, conflict: true},
		{name: "deep file and directory", paths: []string{"x/a", "x/a/b/c"}, conflict: true},
		{name: "empty", paths: nil, want: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := map[string]File{}
			for _, p := range tc.paths {
				payload[p] = File{Data: []byte(p)}
			}
			clean, paths, err := cleanPayload(payload)
			if tc.conflict {
				if !errors.Is(err, errPathConflict) {
					t.Fatalf("err = %v, want a conflict", err)
				}
				return
			}
			if err != nil || !slices.Equal(paths, tc.want) || len(clean) != len(tc.want) {
				t.Fatalf("cleanPayload = %v, %v, %v; want paths %v", clean, paths, err, tc.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		name             string
		version, kubelet bool
	}{
		{name: "..2016_02_01_15_04_05.12345678", version: true, kubelet: true},
		{name: "..2016_02_01_15_04_05.4294967295", version: true, kubelet: true},
		{name: "..2016_02_01_15_04_05.", version: true},
		{name: "..2016_02_01_15_04_05.1a", version: true},
		{name: "..other", version: true},
		{name: "..data"},
		{name: "..data_tmp"},
		{name: ".."},
		{name: "..a/b"},
		{name: "a"},
		{name: "2016_02_01_15_04_05.1"},
	} {
		if got := isVersionName(tc.name); got != tc.version {
			t.Errorf("isVersionName(%q) = %v, want %v", tc.name, got, tc.version)
		}
		if got := isTimestampName(tc.name); got != tc.kubelet {
			t.Errorf("isTimestampName(%q) = %v, want %v", tc.name, got, tc.kubelet)
		}
	}
}

func TestValidateKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []string
		err  string
	}{
		{name: "file names", keys: []string{"a", ".a", "a..b"}},
		{name: "none"},
		{name: "a slash", keys: []string{"a", "b/c"}, err: `key "b/c": invalid path: a key is a file name, it must not contain '/'`},
		{name: "reserved", keys: []string{"..data"}, err: `key "..data": invalid path: must not start with '..': ..data`},
		{name: "dot dot", keys: []string{".."}, err: `key "..": invalid path: must not contain '..': ..`},
		{name: "the first in order", keys: []string{"z/z", "..b", "a/a"}, err: `key "..b": invalid path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]File{}
			for _, k := range tc.keys {
				files[k] = File{}
			}
			err := ValidateKeys(files)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)) {
				t.Errorf("ValidateKeys(%q) = %v, want %q", tc.keys, err, tc.err)
			}
		})
	}
}

func TestNested(t *testing.T) {
	for _, tc := range []struct {
		paths       []string
		file, below string
	}{
		{paths: nil},
		{paths: []string{"a", "b", "c/d"}},
		{paths: []string{"a", "a-x", "a.x", "ab"}},
		{paths: []string{"a", "a/b"}, file: "a", below: "a/b"},
		{paths: []string{"a", "a-x", "a.x", "a/b"}, file: "a", below: "a/b"},
		{paths: []string{"a", "b", "b/c", "b/c/d"}, file: "b", below: "b/c"},
		{paths: []string{"a/b", "a/b/c", "x", "x/y"}, file: "a/b", below: "a/b/c"},
		{paths: []string{"a", "a//b"}, file: "a", below: "a//b"},
	} {
		file, below, ok := Nested(tc.paths)
		if file != tc.file || below != tc.below || ok != (tc.file != "") {
			t.Errorf("Nested(%q) = %q, %q, %v; want %q, %q", tc.paths, file, below, ok, tc.file, tc.below)
		}
	}
}
