// Package buildinfo says which kvindex is running: the module version, the VCS revision
// and the Go toolchain, read once from the binary's embedded build information
// (runtime/debug.ReadBuildInfo). `kvindex version` prints it and serve exports it as
// the kvindex_build_info gauge. It owns no goroutine and no mutable state: Read is safe
// for concurrent use.
//
// Where each field comes from:
//
//   - Version: the -ldflags "-X github.com/kvindex/kvindex/internal/buildinfo.version=vX.Y.Z"
//     override when a release build sets it; otherwise the main module's version, which
//     `go install github.com/kvindex/kvindex/cmd/kvindex@vX.Y.Z` records; otherwise
//     "devel" (a build from a checkout: Go records "(devel)").
//   - Revision and Modified: the vcs.revision and vcs.modified build settings, which Go
//     records when it builds inside a git checkout with -buildvcs on (the default,
//     unless GOFLAGS says -buildvcs=false); empty and false otherwise.
//   - GoVersion: the toolchain that built the binary.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// version is set by release builds with -ldflags -X (see the package comment).
var version string

// Info describes the running binary.
type Info struct {
	Version   string // vX.Y.Z, or "devel"
	Revision  string // the VCS commit, or ""
	Time      string // the commit's time (RFC 3339), or ""
	Modified  bool   // the checkout had uncommitted changes
	GoVersion string
}

// Read returns the running binary's Info.
func Read() Info {
	return fromBuildInfo(debug.ReadBuildInfo())
}

// fromBuildInfo is Read on a given build information (ok false: none embedded).
func fromBuildInfo(bi *debug.BuildInfo, ok bool) Info {
	info := Info{Version: "devel"}
	if ok {
		info.GoVersion = bi.GoVersion
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		info.Version = version
	}
	return info
}

// String is the one line `kvindex version` prints: "kvindex v0.3.0 (abc1234, go1.26.8)",
// with "-dirty" after a revision built from a modified checkout.
func (i Info) String() string {
	var parts []string
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if i.Modified {
			rev += "-dirty"
		}
		parts = append(parts, rev)
	}
	if i.GoVersion != "" {
		parts = append(parts, i.GoVersion)
	}
	if len(parts) == 0 {
		return "kvindex " + i.Version
	}
	return fmt.Sprintf("kvindex %s (%s)", i.Version, strings.Join(parts, ", "))
}
