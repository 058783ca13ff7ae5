package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docFiles are the documents whose command lines TestDocCommandsParse checks, relative
// to the repository root.
var docFiles = []string{"README.md", "BENCHMARKS.md", "DESIGN.md", "sim/README.md", "docs/*.md", "bench/peers/README.md"}

// TestDocCommandsParse: every `kvindex SUBCOMMAND ...` line the documents show (in code
// blocks, indented blocks, inline code and docs markers; `go run ./cmd/kvindex` too)
// names a subcommand that exists and flags that exist and parse with the values given
// (a placeholder value such as N, LOG or R1,R2,... only needs its flag to exist). Every `make TARGET` they
// show is a Makefile target, and every `go run ./DIR` a directory that exists. make
// docs-check runs it.
func TestDocCommandsParse(t *testing.T) {
	root := filepath.Join("..", "..")
	var files []string
	for _, pat := range docFiles {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: no document (%v)", pat, err)
		}
		files = append(files, m...)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z0-9][a-z0-9-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}

	parseOnly = placeholderDefaults
	defer func() { parseOnly = nil }()
	checked := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, c := range docCommands(string(src)) {
			where := fmt.Sprintf("%s:%d: %s", rel, c.line, c.text)
			for _, m := range reMake.FindAllStringSubmatch(c.text, -1) {
				if !targets[m[1]] {
					t.Errorf("%s: make %s: no such Makefile target", where, m[1])
				}
			}
			for _, m := range reGoRun.FindAllStringSubmatch(c.text, -1) {
				if st, err := os.Stat(filepath.Join(root, m[1])); err != nil || !st.IsDir() {
					t.Errorf("%s: go run ./%s: no such directory", where, m[1])
				}
			}
			for _, args := range kvindexInvocations(c.text) {
				if _, ok := commands[args[0]]; !ok {
					t.Errorf("%s: kvindex %s: no such command", where, args[0])
					continue
				}
				var out, errOut bytes.Buffer
				if code := runMain(args, &out, &errOut); code != 0 {
					t.Errorf("%s: kvindex %s: exit %d:\n%s", where, strings.Join(args, " "), code, errOut.String())
				}
				checked++
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d kvindex command lines found in %v: the extraction is broken", checked, files)
	}
	t.Logf("%d kvindex command lines parse", checked)
}

var (
	reMake  = regexp.MustCompile(`(?:^|[\s(;&])make ([a-z0-9][a-z0-9-]*)`)
	reGoRun = regexp.MustCompile(`go run \./([A-Za-z0-9_./-]+?)/?(?:\s|$)`)
	// reKvindex finds an invocation: at the start of a command (of the line, or after
	// a shell operator and environment assignments), kvindex, a path to it or go run
	// ./cmd/kvindex, then a lower-case subcommand.
	reKvindex = regexp.MustCompile(`(?:^|&&|;|\||\()\s*(?:[A-Z_]+=\S*\s+)*(?:go run )?(?:\S*/)?kvindex ([a-z][a-z0-9-]*)(?:\s|$)`)
	reFence   = regexp.MustCompile("^\\s*```")
	reInline  = regexp.MustCompile("`([^`\n]+)`")
	reMarker  = regexp.MustCompile(`^<!-- docs:(?:run|sample) (.*?)(?: \| volatile:.*)? -->$`)
)

type docCommand struct {
	line int
	text string
}

// docCommands returns the command lines of a markdown document: each line of a fenced
// block other than Go (continuations joined), each four-space indented line, each inline
// code span and each docs marker's command.
func docCommands(src string) []docCommand {
	var out []docCommand
	lines := strings.Split(src, "\n")
	inFence, goFence := false, false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if reFence.MatchString(l) {
			if !inFence { // Go code and program output hold no command lines
				lang := strings.TrimPrefix(strings.TrimSpace(l), "```")
				goFence = lang == "go" || lang == "text"
			}
			inFence = !inFence
			continue
		}
		n := i + 1
		switch {
		case inFence && goFence:
		case inFence, strings.HasPrefix(l, "    "):
			text := strings.TrimSpace(l)
			for strings.HasSuffix(text, `\`) && i+1 < len(lines) {
				i++
				text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSpace(lines[i])
			}
			out = append(out, docCommand{n, strings.TrimPrefix(text, "$ ")})
		default:
			if m := reMarker.FindStringSubmatch(l); m != nil {
				out = append(out, docCommand{n, m[1]})
				continue
			}
			for _, m := range reInline.FindAllStringSubmatch(l, -1) {
				out = append(out, docCommand{n, m[1]})
			}
		}
	}
	return out
}

// kvindexInvocations returns the argument lists (subcommand first) of the kvindex
// invocations in one shell line, each up to the next shell operator or comment.
func kvindexInvocations(text string) [][]string {
	var out [][]string
	for _, loc := range reKvindex.FindAllStringSubmatchIndex(text, -1) {
		rest := text[loc[2]:]
		var args []string
		for _, w := range shellWords(rest) {
			if w == "|" || w == "&&" || w == ";" || w == "||" || strings.HasPrefix(w, "#") ||
				strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") || w == ")" {
				break
			}
			args = append(args, w)
		}
		var kept []string
		for _, a := range args {
			switch {
			case a == "..." || a == "[flags]" || a == "MODE" || a == "FLAGS":
			case strings.HasPrefix(a, "[") || strings.HasSuffix(a, "]"): // [--flag VALUE]
				kept = append(kept, strings.Trim(a, "[]"))
			default:
				kept = append(kept, a)
			}
		}
		out = append(out, kept)
	}
	return out
}

// shellWords splits s into words the way sh does for the simple lines documents show:
// blanks separate, single and double quotes group (and are removed), a shell operator
// glued to a word (`x|y`) stays in it.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

var rePlaceholder = regexp.MustCompile(`^(?:[A-Z][A-Z0-9_]*|[A-Z][A-Z0-9_]*(?:,[A-Z][A-Z0-9_]*)*,\.\.\.|.*\.\.\..*)$`)

// placeholderDefaults is parseOnly's rewrite: a flag that exists and whose documented
// value is a placeholder (N, LOG, R1,R2,..., anything with ...) is left out, so that the
// rest of the line is parsed as written.
func placeholderDefaults(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(a, "-") || f == nil {
			out = append(out, a)
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			out = append(out, a)
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		if rePlaceholder.MatchString(value) {
			continue // the flag exists; its value is the reader's to choose
		}
		out = append(out, "--"+name+"="+value)
	}
	return out
}

// TestDocCommandsParseCatchesMistakes: the extraction finds invocations where a shell
// line has them (after env assignments, go run, a path, an operator) and nowhere else,
// and a documented flag that does not exist fails under parseOnly.
func TestDocCommandsParseCatchesMistakes(t *testing.T) {
	got := kvindexInvocations(`KVINDEX_X=1 go run ./cmd/kvindex sim --routers 4 | jq . && bench/out/kvindex replay --ops LOG --json # c`)
	want := [][]string{{"sim", "--routers", "4"}, {"replay", "--ops", "LOG", "--json"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("invocations %q, want %q", got, want)
	}
	if got := kvindexInvocations("the engine's block_size in kvindex to the engine's"); len(got) != 0 {
		t.Fatalf("prose taken for an invocation: %q", got)
	}
	parseOnly = placeholderDefaults
	defer func() { parseOnly = nil }()
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"sim", "--routers", "4", "--trace", "FILE"}, 0},
		{[]string{"replay", "--shards", "N"}, 0},
		{[]string{"sim", "--no-such-flag"}, 2},
		{[]string{"sim", "--routers", "four"}, 2},
	} {
		var out, errOut bytes.Buffer
		if code := runMain(tc.args, &out, &errOut); code != tc.code {
			t.Errorf("kvindex %s: exit %d, want %d (%s)", strings.Join(tc.args, " "), code, tc.code, errOut.String())
		}
	}
}
