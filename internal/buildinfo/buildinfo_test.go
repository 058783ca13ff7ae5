package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFromBuildInfo(t *testing.T) {
	cases := []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want Info
		line string
	}{
		{name: "none embedded", want: Info{Version: "devel"}, line: "kvindex devel"},
		{
			name: "checkout",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T00:00:00Z"}, {Key: "vcs.modified", Value: "true"},
			}},
			ok:   true,
			want: Info{Version: "devel", Revision: "0123456789abcdef0123", Time: "2026-12-01T00:00:00Z", Modified: true, GoVersion: "go1.26.8"},
			line: "kvindex devel (0123456789ab-dirty, go1.26.8)",
		},
		{
			name: "go install @version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.4.0"}},
			ok:   true,
			want: Info{Version: "v0.4.0", GoVersion: "go1.26.8"},
			line: "kvindex v0.4.0 (go1.26.8)",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fromBuildInfo(c.bi, c.ok)
			require.Equal(t, c.want, got)
			require.Equal(t, c.line, got.String())
		})
	}
}

func TestLinkerOverride(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.9.9"
	got := fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, true)
	require.Equal(t, "v9.9.9", got.Version)
}
