package agent

import (
	"runtime/debug"
	"strings"
)

// buildVersion is what the binary knows of its own build: its module's
// version, the VCS revision it was built from and the Go release. It is
// printed by --version and logged once at start, so that a node's log says
// which agent ran.
type buildVersion struct {
	// Version is the main module's version: a tag (v1.2.3) or a
	// pseudo-version when built with `go install module@version`,
	// "(devel)" when built from a checkout.
	Version string
	// Revision is the VCS commit (vcs.revision), empty when the build had
	// no VCS information (-buildvcs=false, a test binary, go run of files).
	Revision string
	// Modified is vcs.modified: the work tree had uncommitted changes.
	Modified bool
	// GoVersion is the Go release the binary was built with.
	GoVersion string
}

// readBuildVersion reads the running binary's build information.
func readBuildVersion() buildVersion {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{Version: "unknown", GoVersion: "unknown"}
	}
	return versionOf(info)
}

// versionOf extracts a buildVersion from build information; fields it
// lacks read "unknown" (the version) or stay empty (the revision).
func versionOf(info *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: info.Main.Version, GoVersion: info.GoVersion}
	if v.Version == "" {
		v.Version = "unknown"
	}
	if v.GoVersion == "" {
		v.GoVersion = "unknown"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// revision is the VCS revision as printed: "unknown" without one, with
// "-dirty" when the work tree was modified.
func (v buildVersion) revision() string {
	if v.Revision == "" {
		return "unknown"
	}
	if v.Modified {
		return v.Revision + "-dirty"
	}
	return v.Revision
}

// String is --version's line: "nodeagent VERSION revision REV GO".
func (v buildVersion) String() string {
	return strings.Join([]string{"nodeagent", v.Version, "revision", v.revision(), v.GoVersion}, " ")
}
