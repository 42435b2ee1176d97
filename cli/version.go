package cli

import (
	"runtime/debug"
	"strings"
)

// version describes the running binary for --version: the main module's
// version (a tag with go install module@version, "(devel)" for a build in
// the source tree), then the VCS revision, its time and "dirty" for
// uncommitted changes when the build recorded them (go build in a
// checkout does; go run and go test do not), then the Go version. Cost: one
// read of the build information embedded in the binary.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information)"
	}
	return formatVersion(bi)
}

// formatVersion is version for the build information bi.
func formatVersion(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	parts := []string{v}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		r := "revision " + rev
		if at != "" {
			r += " (" + at + ")"
		}
		if dirty {
			r += " dirty"
		}
		parts = append(parts, r)
	}
	if bi.GoVersion != "" {
		parts = append(parts, bi.GoVersion)
	}
	return strings.Join(parts, ", ")
}
