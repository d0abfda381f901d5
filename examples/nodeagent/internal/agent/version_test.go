package agent

import (
	"runtime/debug"
	"testing"
)

// TestVersionOf: the version line has the module version, the VCS
// revision (marked when the tree was modified) and the Go release, and
// says "unknown" for what the build did not record.
func TestVersionOf(t *testing.T) {
	for _, tt := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{
			name: "release",
			info: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.4.0"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "55a3700"}, {Key: "vcs.modified", Value: "false"}}},
			want: "nodeagent v0.4.0 revision 55a3700 go1.26.0",
		},
		{
			name: "checkout with changes",
			info: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
				Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}, {Key: "vcs.revision", Value: "2b977ed"}}},
			want: "nodeagent (devel) revision 2b977ed-dirty go1.26.0",
		},
		{
			name: "no VCS information",
			info: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			want: "nodeagent (devel) revision unknown go1.26.0",
		},
		{
			name: "nothing recorded",
			want: "nodeagent unknown revision unknown unknown",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionOf(&tt.info).String(); got != tt.want {
				t.Errorf("%q, want %q", got, tt.want)
			}
		})
	}
}
