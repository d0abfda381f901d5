package driver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/internal/fsutil"
)

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := &volumeState{ID: "vol-1", Name: "one", CapacityBytes: 1 << 20,
		Stage:   &stageState{Path: "/s", Device: "/dev/loop1"},
		Targets: map[string]targetState{"/t": {ReadOnly: true}}}
	if err := s.put(v); err != nil {
		t.Fatal(err)
	}
	// What get returns is a copy: changing it changes nothing stored.
	got := s.get("vol-1")
	got.Stage.Path = "/changed"
	got.Targets["/u"] = targetState{}
	if again := s.get("vol-1"); again.Stage.Path != "/s" || len(again.Targets) != 1 {
		t.Fatalf("stored state changed through a copy: %+v", again)
	}
	// A crash in the middle of an atomic write leaves a temporary file.
	if err := os.WriteFile(filepath.Join(dir, "volumes", ".vol-1.json.tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := openStore(dir)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	if got := s2.get("vol-1"); got == nil || got.Name != "one" || got.Version != stateVersion || got.Stage.Device != "/dev/loop1" {
		t.Fatalf("after reopening: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", ".vol-1.json.tmp-123")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file not cleaned up: %v", err)
	}
	if err := s2.remove("vol-1"); err != nil {
		t.Fatal(err)
	}
	if err := s2.remove("vol-1"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if len(s2.list()) != 0 {
		t.Fatalf("list after remove: %v", s2.list())
	}
}

// TestReadNodeState: what the store saved reads back from outside the
// driver as staging path and sorted targets; a missing volume is
// fs.ErrNotExist, a bad ID is refused before any path is built from it.
func TestReadNodeState(t *testing.T) {
	dir := t.TempDir()
	s, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*volumeState{
		{ID: "staged", Name: "a", CapacityBytes: 1 << 20, Stage: &stageState{Path: "/s"},
			Targets: map[string]targetState{"/t2": {}, "/t1": {}}},
		{ID: "idle", Name: "b", CapacityBytes: 1 << 20},
	} {
		if err := s.put(v); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := ReadNodeState(dir, "staged"); err != nil || got.StagingPath != "/s" || strings.Join(got.Targets, ",") != "/t1,/t2" {
		t.Errorf("staged: %+v, %v", got, err)
	}
	if got, err := ReadNodeState(dir, "idle"); err != nil || got.StagingPath != "" || len(got.Targets) != 0 {
		t.Errorf("idle: %+v, %v", got, err)
	}
	if _, err := ReadNodeState(dir, "gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing volume: %v, want ErrNotExist", err)
	}
	if _, err := ReadNodeState(dir, "../volumes/staged"); err == nil {
		t.Error("a volume ID with a path in it was read")
	}
}

func TestStoreRefusesBadFiles(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"corrupt", "vol-1.json", `{"version":1,`, "corrupt"},
		{"unknown version", "vol-1.json", `{"version":2,"id":"vol-1","name":"n","capacityBytes":1}`, "unknown format version 2"},
		{"no version", "vol-1.json", `{"id":"vol-1","name":"n","capacityBytes":1}`, "unknown format version 0"},
		{"wrong ID", "vol-1.json", `{"version":1,"id":"vol-2","name":"n","capacityBytes":1}`, `"vol-2"`},
		{"no name", "vol-1.json", `{"version":1,"id":"vol-1","capacityBytes":1}`, "no name"},
		{"relative stage", "vol-1.json", `{"version":1,"id":"vol-1","name":"n","capacityBytes":1,"stage":{"path":"x"}}`, "relative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "volumes"), 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "volumes", tc.file)
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := newServer(options{NodeID: "n", StateDir: dir})
			if err == nil {
				t.Fatal("New succeeded on a bad state file")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s and say %q", err, path, tc.want)
			}
			if tc.name == "corrupt" && !errors.Is(err, fsutil.ErrCorrupt) {
				t.Errorf("error %v does not wrap fsutil.ErrCorrupt", err)
			}
		})
	}
}

func TestNewChecksConfig(t *testing.T) {
	dir := t.TempDir()
	for _, cfg := range []options{
		{StateDir: dir},
		{NodeID: "n"},
		{NodeID: "n", StateDir: dir, DriverName: "-bad"},
		{NodeID: "n", StateDir: dir, DriverName: strings.Repeat("a", 64)},
		{NodeID: "n", StateDir: dir, MaxVolumes: -1},
	} {
		if _, err := newServer(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
	d, err := newServer(options{NodeID: "n", StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if d.name != DefaultDriverName || d.maxVolumes != defaultMaxVolumes {
		t.Errorf("defaults: name %q, max volumes %d", d.name, d.maxVolumes)
	}
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"unix:///run/csi/x.sock": "/run/csi/x.sock",
		"/run/csi/x.sock":        "/run/csi/x.sock",
		"unix://rel.sock":        "rel.sock",
		"tcp://1.2.3.4:5":        "",
		"unix://":                "",
		"":                       "",
	} {
		got, err := parseEndpoint(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("parseEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
