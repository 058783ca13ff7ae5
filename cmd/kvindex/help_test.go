package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testsize"
)

// helpFlag is one flag of a command's -h output.
type helpFlag struct {
	name, typ, help string // typ: PrintDefaults' placeholder ("" for a bool)
}

// commandHelp is a command's -h output, parsed.
type commandHelp struct {
	text  string // the whole output
	about string // the description (c.about)
	flags map[string]helpFlag
	order []string // flag names as printed
}

// flagHead is PrintDefaults' first line of a flag: "  -name" or "  -name TYPE".
var flagHead = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)(?: (\S+))?$`)

// placeholder is a flag's value placeholder: a Go type name PrintDefaults prints, or an
// upper-case name a back-quoted word of the help chose (DIR). Anything else is a
// back-quoted phrase of the help taken for the placeholder (flag.UnquoteUsage), which
// reads as a flag named "-peers make bench-peers".
var placeholder = regexp.MustCompile(`^(string|int|uint|int64|uint64|float|duration|value|[A-Z][A-Z0-9_]*)$`)

func parseHelp(t *testing.T, name string) commandHelp {
	t.Helper()
	code, out, errs := runCLI(t, name, "-h")
	if code != 0 || errs != "" {
		t.Fatalf("%s -h: exit %d, stderr %q", name, code, errs)
	}
	h := commandHelp{text: out, about: commands[name].about, flags: map[string]helpFlag{}}
	_, flagsPart, ok := strings.Cut(out, "\nflags:\n")
	if !ok {
		t.Fatalf("%s -h: no flags section", name)
	}
	var cur *helpFlag
	flush := func() {
		if cur != nil {
			h.flags[cur.name] = *cur
			h.order = append(h.order, cur.name)
		}
	}
	for _, line := range strings.Split(strings.TrimRight(flagsPart, "\n"), "\n") {
		if line == "" {
			continue
		}
		if m := flagHead.FindStringSubmatch(line); m != nil {
			flush()
			cur = &helpFlag{name: m[1], typ: m[2]}
			if m[2] != "" && !placeholder.MatchString(m[2]) {
				t.Errorf("%s -h: --%s's placeholder is %q: a back-quoted phrase of its help (flag.UnquoteUsage takes the first one for the value's name)", name, m[1], m[2])
			}
			continue
		}
		body, ok := strings.CutPrefix(line, "    \t")
		if !ok || cur == nil {
			t.Errorf("%s -h: line %q is neither a flag nor its help (a back-quoted phrase with spaces?)", name, line)
			continue
		}
		cur.help += body + " "
	}
	flush()
	return h
}

// externalFlags are flags the help texts name that belong to other programs.
var externalFlags = map[string]string{
	"kv-events-config": "vLLM's and SGLang's engine option",
}

// flagMention finds "--name" or "-name" in running text (not "-1", not a hyphenated
// word).
var flagMention = regexp.MustCompile(`(?:^|[\s(\[,;'"/])(--?)([a-z][a-z0-9]*(?:-[a-z0-9]+)*)\b`)

// commandBefore returns the command whose name the text ends with, followed only by
// flags and their values: a mention right after it ("serve --nats --models",
// "kvindex serve --tiers") is that command's flag. "kvindex" alone names the top-level
// flags.
func commandBefore(text string) string {
	names := []string{"kvindex"}
	for name := range commands {
		names = append(names, regexp.QuoteMeta(name))
	}
	re := regexp.MustCompile(`(?:^|[^\w-])(` + strings.Join(names, "|") + `)((?:\s+--?[a-z][\w-]*(?:[ =][^\s-]\S*)?)*)\s+$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestHelpNamesOnlyFlagsThatExist: every command's -h is well formed (each flag's
// placeholder is a type or an upper-case name) and every flag it mentions is one of the
// command's, one of the command's named just before it ("as kvindex serve --tiers"), or
// another program's (externalFlags).
func TestHelpNamesOnlyFlagsThatExist(t *testing.T) {
	helps := map[string]commandHelp{}
	for name := range commands {
		helps[name] = parseHelp(t, name)
	}
	for name, h := range helps {
		if len(h.flags) == 0 && name != "version" {
			t.Errorf("%s -h: no flags parsed", name)
		}
		texts := []string{h.about}
		for _, f := range h.order {
			texts = append(texts, h.flags[f].help)
		}
		for _, text := range texts {
			for _, m := range flagMention.FindAllStringSubmatchIndex(text, -1) {
				flag := text[m[4]:m[5]]
				if flag == "h" || externalFlags[flag] != "" {
					continue
				}
				owner := name
				switch other := commandBefore(text[:m[2]]); other {
				case "":
				case "kvindex":
					if flag == "version" || flag == "help" { // runMain's own
						continue
					}
				default:
					owner = other
				}
				if _, ok := helps[owner].flags[flag]; !ok {
					t.Errorf("%s -h mentions --%s, which %s does not have: %q", name, flag, owner, strings.TrimSpace(text))
				}
			}
		}
	}
}

// valueList is a list of values a flag's help offers.
type valueList struct {
	cmd, flag string
	key       string // the --engine spec key the values are for, or ""
	values    []string
	phrase    string   // as the help has it
	needs     []string // flags the values need ("with --zero-time: a, b or c")
}

var (
	// "debug, info, warn or error", ".svg, .png or .pdf"
	orList = regexp.MustCompile(`(?:^|[\s(:])((?:[.\w][\w.-]*(?: \([^()]*\))?, )+[.\w][\w.-]*(?: \([^()]*\))?,? or [.\w][\w.-]*)`)
	// ": none (round-robin) or session (", "(exec (...) or inproc (...))"
	orPair = regexp.MustCompile(`(?:^|: |\()([a-z][\w-]*)(?: \([^()]*(?:\([^()]*\)[^()]*)*\))? or ([a-z][\w-]*)(?: \(|\)|$| \[)`)
	// ": longest-prefix, round-robin, random" (the end of the help or of its clause)
	colonList = regexp.MustCompile(`: ([a-z][\w-]*(?: \([^()]*\))?(?:, [a-z][\w-]*(?: \([^()]*\))?)+)(?: \(default|$)`)
	// "kv-aware,kv-aware-predict,approximate" (a list flag's values as one)
	commaValue = regexp.MustCompile(`(?:^|[\s("])([a-z][\w-]*(?:,[a-z][\w-]*)+)(?:[\s)"]|$)`)
	// ",hash_algo=sha256 or sha256_cbor]" in an --engine spec
	keyOr = regexp.MustCompile(`,([a-z_]+)=([\w.-]+) or ([\w.-]+)\]`)
	// ",media=GPU|CPU (" in an --engine spec: one |-separated value
	keyList = regexp.MustCompile(`,([a-z_]+)=([\w.-]+(?:\|[\w.-]+)+) \(`)
	// "speedup=X1,X2,..." in --sweep
	sweepKey = regexp.MustCompile(`\b([a-z][a-z-]*)=[A-Z]\w*,`)
	// "with --zero-time: " right before a list
	withFlag = regexp.MustCompile(`with (--[a-z][\w-]*):? ?$`)
	dropNote = regexp.MustCompile(` \([^()]*(?:\([^()]*\)[^()]*)*\)`)
)

func splitList(phrase string) []string {
	phrase = dropNote.ReplaceAllString(phrase, "")
	phrase = strings.ReplaceAll(phrase, ", or ", ", ")
	phrase = strings.ReplaceAll(phrase, " or ", ", ")
	return strings.Split(phrase, ", ")
}

// valueLists extracts every list of values the flags' helps offer (a flag's values,
// an --engine spec key's, --sweep's forms).
func valueLists(name string, h commandHelp) []valueList {
	var out []valueList
	for _, f := range h.order {
		help := strings.TrimSpace(h.flags[f].help)
		seen := map[string]bool{}
		var needs []string // of the list being added, from where it starts
		add := func(key, phrase string, values []string) {
			if !seen[key+phrase] {
				seen[key+phrase] = true
				out = append(out, valueList{cmd: name, flag: f, key: key, values: values, phrase: phrase, needs: needs})
			}
		}
		// addAt adds the list the regexp's group 1 (and 2) captured at m.
		addAt := func(m []int, split bool) {
			needs = nil
			if w := withFlag.FindStringSubmatch(help[:m[2]]); w != nil {
				needs = []string{w[1]}
			}
			phrase := help[m[2]:m[3]]
			switch {
			case len(m) > 4:
				add("", help[m[0]:m[1]], []string{phrase, help[m[4]:m[5]]})
			case split:
				add("", phrase, splitList(phrase))
			default:
				add("", phrase, []string{phrase})
			}
			needs = nil
		}
		for _, m := range keyOr.FindAllStringSubmatch(help, -1) {
			add(m[1], m[0], []string{m[2], m[3]})
		}
		for _, m := range keyList.FindAllStringSubmatch(help, -1) {
			add(m[1], m[2], []string{m[2]})
		}
		if f == "sweep" {
			var keys []string
			for _, m := range sweepKey.FindAllStringSubmatch(help, -1) {
				if !slices.Contains(keys, m[1]) {
					keys = append(keys, m[1])
				}
			}
			add("", "sweep forms", keys)
			continue
		}
		if f == "engine" {
			continue // its keys' values above; the rest is the spec's syntax
		}
		for _, m := range orList.FindAllStringSubmatchIndex(help, -1) {
			addAt(m, true)
		}
		for _, m := range colonList.FindAllStringSubmatchIndex(help, -1) {
			addAt(m, true)
		}
		for _, m := range orPair.FindAllStringSubmatchIndex(help, -1) {
			addAt(m, false)
		}
		for _, m := range commaValue.FindAllStringSubmatchIndex(help, -1) {
			addAt(m, false)
		}
	}
	return out
}

// listFlags take a comma-separated list: their values are tried all at once.
func isListFlag(h helpFlag) bool { return strings.Contains(h.help, "comma-separated") }

// sweepSamples are a value of each --sweep form (and what else it needs).
var sweepSamples = map[string][]string{
	"speedup":       {"--sweep", "speedup=1,2"},
	"routers":       {"--sweep", "routers=1,2"},
	"capacity":      {"--sweep", "capacity=600,700"},
	"event-delay":   {"--sweep", "event-delay=0s,1ms"},
	"host-capacity": {"--zero-time", "--sweep", "host-capacity=0,100"},
}

// valueArgs is the command line that gives l's flag value v.
func valueArgs(t *testing.T, l valueList, v string) []string {
	return append(slices.Clone(l.needs), flagArgs(t, l, v)...)
}

func flagArgs(t *testing.T, l valueList, v string) []string {
	switch {
	case l.key != "":
		return []string{"--engine", "endpoint=tcp://127.0.0.1:1," + l.key + "=" + v}
	case l.flag == "tiers":
		return []string{"--tiers", "NVME=" + v}
	case l.flag == "chart":
		return []string{"--sweep", "speedup=1,2", "--policies", "random", "--chart", filepath.Join(t.TempDir(), "chart"+v)}
	case l.flag == "workload" && v == "shared-context":
		return []string{"--workload", v, "--groups", "2", "--users", "2"} // a tiny one
	case l.flag == "sweep":
		if a, ok := sweepSamples[v]; ok {
			return append(a, "--policies", "random", "--chart", filepath.Join(t.TempDir(), "chart.svg"))
		}
		return []string{"--sweep", v + "=1"}
	}
	return []string{"--" + l.flag, v}
}

// tryCommand runs cmd with args as cheaply as the command allows (a tiny workload, a
// check-only mode, a NATS server that is not there, a cancelled context) and returns
// its exit status and stderr: 2 says the command refused a flag.
func tryCommand(t *testing.T, cmd string, args []string) (int, string) {
	t.Helper()
	tiny := map[string][]string{
		"sim":     {"--requests", "20", "--workers", "2", "--capacity", "600"},
		"gen-ops": {"--requests", "20", "--capacity", "600", "--out", filepath.Join(t.TempDir(), "ops.jsonl")},
		"bench":   {"--gen", "300", "--shards", "1", "--producers", "1", "--queriers", "1", "--duration", "10ms"},
		"serve":   {"--check", "--listen", "127.0.0.1:0", "--engine", "endpoint=tcp://127.0.0.1:1"},
		"relay":   {"--nats", "nats://127.0.0.1:1", "--connect-timeout", "1ms", "--engine", "endpoint=tcp://127.0.0.1:1"},
		"doctor":  {"--engine", "endpoint=tcp://127.0.0.1:1", "--for", "1ms"},
		"replay":  {"--ops", "../../testdata/demo.jsonl"},
	}
	if cmd == "doctor" && slices.Contains(args, "--hash-algo") {
		args = append(args, "--hash-seed", "0")
	}
	base := slices.Clone(tiny[cmd])
	if i := slices.Index(base, "--engine"); i >= 0 && slices.Contains(args, "--engine") {
		base = slices.Delete(base, i, i+2) // the value's engine replaces the default one
	}
	full := append(base, args...)
	var out, errOut syncBuffer
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	switch cmd { // the long-running ones, stopped as soon as they have started
	case "demo":
		return demoMain(cancelled, append([]string{"--listen", "127.0.0.1:0", "--engines", "1"}, args...), &out, &errOut), errOut.String()
	case "loadtest":
		if !slices.Contains(args, "--server") {
			full = append(full, "--server", "inproc")
		}
		// With --server exec, loadtest renices every thread of its process, for good:
		// here that is this test binary, whose later tests (and their node and serve
		// children) would run at nice 10 behind any busy neighbour.
		full = append(full, "--loadgen-nice", "0")
		full = append(full, "--engines", "1", "--rates", "100", "--no-warmup", "--queries", "0", "--probes", "0")
		return loadtestMain(cancelled, full, &out, &errOut), errOut.String()
	}
	code, _, stderr := runCLI(t, append([]string{cmd}, full...)...)
	return code, stderr
}

// TestHelpValuesAreAccepted: every value a command's -h lists for a flag (or an
// --engine spec key, or --sweep's forms) is accepted by that command, and a value
// outside the list is refused with an error that names every listed one.
func TestHelpValuesAreAccepted(t *testing.T) {
	t.Setenv(serveChildEnv, "1") // loadtest --server exec runs this test binary as serve
	nice := maxThreadNice(t)
	defer func() {
		if after := maxThreadNice(t); after != nice {
			t.Errorf("a command run in process reniced this test binary's threads: nice %d, was %d", after, nice)
		}
	}()
	var lists []valueList
	for name := range commands {
		lists = append(lists, valueLists(name, parseHelp(t, name))...)
	}
	if len(lists) < 15 {
		t.Fatalf("found only %d value lists in the helps", len(lists))
	}
	sort.Slice(lists, func(i, j int) bool {
		return lists[i].cmd+lists[i].flag+lists[i].phrase < lists[j].cmd+lists[j].flag+lists[j].phrase
	})
	for _, l := range lists {
		t.Logf("%s --%s %s: %q %v", l.cmd, l.flag, l.key, l.values, l.needs)
		h := parseHelp(t, l.cmd).flags[l.flag]
		tries := l.values
		switch {
		case isListFlag(h):
			tries = []string{strings.Join(l.values, ",")}
		case l.flag == "chart" && !testsize.Full():
			tries = tries[:1] // rasterising a chart is seconds under the race detector
		}
		for _, v := range tries {
			if code, stderr := tryCommand(t, l.cmd, valueArgs(t, l, v)); code == 2 {
				t.Errorf("%s --%s %s (its help lists %q): refused: %s", l.cmd, l.flag, l.key+v, l.phrase, stderr)
			}
		}
		if l.flag == "sweep" || len(l.values) == 1 {
			continue // a sample value, not a closed list
		}
		code, stderr := tryCommand(t, l.cmd, valueArgs(t, l, "bogus"))
		if code != 2 {
			t.Errorf("%s --%s %sbogus: exit %d, want 2 (stderr %q)", l.cmd, l.flag, l.key, code, stderr)
			continue
		}
		for _, v := range l.values {
			if !strings.Contains(stderr, v) {
				t.Errorf("%s --%s %sbogus: the error does not name %q, which the help lists: %s", l.cmd, l.flag, l.key, v, stderr)
			}
		}
	}
}

// maxThreadNice is the highest nice value among this process's threads (Linux's
// /proc/self/task; -100 where it cannot be read, so that the check compares equal).
func maxThreadNice(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -100
	}
	most := -100
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // exited
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 17 {
			continue
		}
		if n, err := strconv.Atoi(f[16]); err == nil { // field 19 of stat: nice
			most = max(most, n)
		}
	}
	return most
}
