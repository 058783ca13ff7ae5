package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/buildinfo"
)

// TestEveryCommandFollowsTheConvention walks the commands table: -h prints the usage to
// stdout and exits 0, an unknown flag and a positional argument exit 2 with the reason on
// stderr, and each command has a summary, a synopsis and a description.
func TestEveryCommandFollowsTheConvention(t *testing.T) {
	if len(commands) < 6 {
		t.Fatalf("commands table has %d entries", len(commands))
	}
	for name, c := range commands {
		t.Run(name, func(t *testing.T) {
			if c.summary == "" || c.synopsis == "" || c.about == "" {
				t.Fatalf("%s: summary %q, synopsis %q, about %q: all three are required", name, c.summary, c.synopsis, c.about)
			}
			for _, h := range []string{"-h", "--help"} {
				code, out, errs := runCLI(t, name, h)
				if code != 0 || errs != "" || !strings.HasPrefix(out, "usage: kvindex "+name+" ") ||
					!strings.Contains(out, c.about) || !strings.Contains(out, "\nflags:\n") {
					t.Fatalf("%s %s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout only", name, h, code, out, errs)
				}
			}
			code, out, errs := runCLI(t, name, "--no-such-flag")
			if code != 2 || out != "" || !strings.Contains(errs, "flag provided but not defined: -no-such-flag") ||
				!strings.Contains(errs, "run 'kvindex "+name+" -h' for the flags") || strings.Contains(errs, "usage: kvindex") ||
				strings.Count(errs, "\n") > 2 {
				t.Fatalf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want 2, the error and one line pointing to -h on stderr", name, code, out, errs)
			}
			code, out, errs = runCLI(t, name, "stray")
			if code != 2 || out != "" || !strings.Contains(errs, `unexpected argument "stray"`) {
				t.Fatalf("%s stray: exit %d, stdout %q, stderr %q; want 2", name, code, out, errs)
			}
		})
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errs := runCLI(t, args...)
		if code != 0 || errs != "" || !strings.Contains(out, "commands:") {
			t.Errorf("kvindex %s: exit %d, stdout %q, stderr %q", args[0], code, out, errs)
		}
	}
	if code, out, errs := runCLI(t); code != 2 || out != "" || !strings.Contains(errs, "commands:") {
		t.Errorf("kvindex: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", code, out, errs)
	}
	if code, _, errs := runCLI(t, "frobnicate"); code != 2 || !strings.Contains(errs, `unknown command "frobnicate"`) {
		t.Errorf("kvindex frobnicate: exit %d, stderr %q", code, errs)
	}
}

// TestUsageAndRuntimeExitCodes: the same kind of mistake exits the same way in every
// command that can make it: a bad --shards is a usage error (2), an input file that
// does not exist a runtime failure (1).
func TestUsageAndRuntimeExitCodes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.jsonl")
	unwritable := filepath.Join(t.TempDir(), "no-such-dir", "out.jsonl")
	nats := "nats://127.0.0.1:1" // never dialled: every case fails before
	for _, tc := range []struct {
		code int
		args []string
		want string
	}{
		{2, []string{"sim", "--shards", "1000"}, "--shards 1000"},
		{2, []string{"gen-ops", "--out", unwritable, "--shards", "1000"}, "--shards 1000"},
		{2, []string{"replay", "--ops", missing, "--shards", "1000"}, "--shards 1000"},
		{2, []string{"replay", "--ops", missing, "--jump", "-1"}, "--jump -1"},
		{2, []string{"bench", "--shards", "1000"}, "--shards"},
		{2, []string{"serve", "--engine", "endpoint=tcp://h:1", "--shards", "1000"}, "Shards = 1000"},
		{2, []string{"replay"}, "--ops FILE is required"},
		{2, []string{"relay", "--ops", missing}, "--nats is required"},

		{1, []string{"sim", "--trace", missing}, "missing.jsonl"},
		{1, []string{"gen-ops", "--out", unwritable, "--requests", "20", "--sessions", "2", "--capacity", "600"}, "no-such-dir"},
		{1, []string{"replay", "--ops", missing}, "missing.jsonl"},
		{1, []string{"bench", "--ops", missing}, "missing.jsonl"},
		{1, []string{"relay", "--nats", nats, "--ops", missing}, "missing.jsonl"},
		{1, []string{"serve", "--config", missing}, "missing.jsonl"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("kvindex %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errs, tc.code, tc.want)
		}
	}
}

// sharedFlagExceptions are the flags that deliberately differ between commands, with why.
var sharedFlagExceptions = map[string]string{
	// bench compares several shard counts in one run; a single count is a list of one.
	"shards": "bench takes a comma-separated list",
	// sim's built-in workload is generated at 64-token blocks; serve's engines default
	// to vLLM's 16 when their spec names none.
	"block-size": "sim/gen-ops default to the workload's 64, serve to vLLM's 16",
	// sim's engines are sized from a named model and GPU; gen-ops keeps the capacity its
	// op logs (and the conformance logs) were made with.
	"capacity": "sim: 4,802 blocks (Qwen3-32B on 2 x H100); gen-ops: 4,096",
	// sim routes simulated requests; serve names the default answer of /v1/match. The
	// two sets of policies differ.
	"policy": "gen-ops: a simulated router's policy; serve: /v1/match's default policy",
	// The same D,H,DISK weights; serve's default comes from its config file (the flag
	// replaces it), sim and gen-ops have none, so their flag default is the value.
	"tier-weights": "serve: \"\" (the config's tier_weights); sim/gen-ops: 1,0.75,0.25",
	// loadtest loads serve with many engines; demo starts a few to read about.
	"engines": "loadtest: 64; demo: 4",
	// serve always serves its API (on 127.0.0.1:8080 unless told); a relay serves its
	// health and metrics endpoints only where asked.
	"listen": "serve: the API, default 127.0.0.1:8080; relay: /healthz, /readyz, /metrics, off unless given",
}

// flagLine matches one flag of PrintDefaults' output: "  -name type" (no type for a
// bool) on its own line, then its help, whose "(default X)" ends it when non-zero.
var flagLine = regexp.MustCompile(`(?m)^  -(\S+)(?: (\S+))?\n((?:    \t.*\n)+)`)

// TestSharedFlagsAgree: a flag several commands define has one type and one default.
func TestSharedFlagsAgree(t *testing.T) {
	type def struct{ cmd, typ, dflt string }
	defs := map[string][]def{}
	dfltRE := regexp.MustCompile(`\(default (.*)\)\n$`)
	for name := range commands {
		_, out, _ := runCLI(t, name, "-h")
		for _, m := range flagLine.FindAllStringSubmatch(out, -1) {
			d := def{cmd: name, typ: m[2]}
			if dm := dfltRE.FindStringSubmatch(m[3]); dm != nil {
				d.dflt = dm[1]
			}
			defs[m[1]] = append(defs[m[1]], d)
		}
	}
	if len(defs["shards"]) < 4 || len(defs["engine"]) < 2 || len(defs["nats"]) != 2 {
		t.Fatalf("parsed too few flags from the usages: %v", defs)
	}
	names := make([]string, 0, len(defs))
	for n := range defs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ds := defs[n]
		for _, d := range ds[1:] {
			if (d.typ != ds[0].typ || d.dflt != ds[0].dflt) && sharedFlagExceptions[n] == "" {
				t.Errorf("--%s: %s has %s (default %q), %s has %s (default %q)", n, ds[0].cmd, ds[0].typ, ds[0].dflt, d.cmd, d.typ, d.dflt)
			}
		}
	}
}

// TestDocListsTheTable: doc.go's command list is the commands table, line for line.
func TestDocListsTheTable(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^//\tkvindex (\S+) +(.+)$`).FindAllStringSubmatch(string(src), -1) {
		listed[m[1]] = m[2]
	}
	for name, c := range commands {
		if listed[name] != c.summary {
			t.Errorf("doc.go lists %s as %q; the table says %q", name, listed[name], c.summary)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("doc.go lists %s, which the table does not have", name)
	}
}

// TestVersion: `kvindex version` and `kvindex --version` print the binary's build line.
func TestVersion(t *testing.T) {
	want := buildinfo.Read().String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out, errs strings.Builder
		if code := runMain(args, &out, &errs); code != 0 || out.String() != want || errs.Len() != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 0 and %q", args, code, out.String(), errs.String(), want)
		}
	}
}
