// Command docsgen keeps the figures README.md quotes from going stale. `make docs` runs
// it with -write, `make docs-check` (part of `make test`) without.
//
// A figure block in a document is a fenced code block directly after a marker line:
//
//	<!-- docs:run COMMAND -->                  COMMAND's output, regenerated and checked
//	<!-- docs:run COMMAND | volatile: RE... --> lines matching any RE (Go regexps,
//	                                            space-separated) are timings or memory:
//	                                            checked with their digits masked
//	<!-- docs:file PATH -->                    the file PATH, character for character
//	<!-- docs:sample COMMAND -->               COMMAND's output where it is not
//	                                            deterministic (ports, a live engine):
//	                                            shown as produced, not regenerated
//
// COMMAND runs under bash from the repository root with a freshly built kvindex first on
// PATH, once per docsgen run: documents quoting the same command (README.md and
// sim/README.md both quote `kvindex sim`) are checked against one output. Every `text`
// block must follow a marker, so every figure a document quotes names the command it
// came from; TestDocCommandsParse (cmd/kvindex) checks that every
// documented command line parses. With -write each run and file block is replaced by
// what the command prints now; without it, any difference in what is deterministic is
// reported and the exit status is 1.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

func main() {
	write := flag.Bool("write", false, "rewrite the figure blocks instead of checking them")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./internal/docsgen [-write] FILE.md...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	bin, err := os.MkdirTemp("", "docsgen")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(bin)
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "kvindex"), "./cmd/kvindex").CombinedOutput(); err != nil {
		fatal(fmt.Errorf("go build ./cmd/kvindex: %v\n%s", err, out))
	}
	failed := false
	p := &producer{outputs: map[string][]string{}, run: func(command string) ([]byte, error) { return runCommand(command, bin) }}
	for _, f := range flag.Args() {
		problems, err := process(f, p, *write)
		if err != nil {
			fatal(err)
		}
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "%s: %s\n", f, p)
			failed = true
		}
	}
	if failed {
		fmt.Fprintln(os.Stderr, "docs-check: the documents differ from what their commands print: run make docs (and review the diff)")
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "docsgen:", err)
	os.Exit(1)
}

var (
	reMarker = regexp.MustCompile(`^<!-- docs:(run|file|sample) (.*?) -->$`)
	reFence  = regexp.MustCompile("^```([a-z]*)$")
	reDigits = regexp.MustCompile(`[0-9]+(?:[.,][0-9]+)*`)
)

// block is one figure block: its marker and the lines of its fenced body.
type block struct {
	kind, command string
	volatile      []*regexp.Regexp
	line          int // of the marker, 1-based
	start, end    int // body lines [start, end) in the document's lines
}

// process checks (or, with write, rewrites) the figure blocks of one document and
// returns what differs.
func process(path string, p *producer, write bool) (problems []string, err error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(src), "\n")
	blocks, problems := parse(lines)
	// Rewrite from the last block up, so earlier blocks' line numbers hold.
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if b.kind == "sample" {
			continue
		}
		got, err := p.produce(b)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%d: %s: %v", b.line, b.command, err))
			continue
		}
		want := lines[b.start:b.end]
		if write {
			lines = append(lines[:b.start], append(got, lines[b.end:]...)...)
			continue
		}
		if d := differ(want, got, b.volatile); d != "" {
			problems = append(problems, fmt.Sprintf("%d: docs:%s %s: %s", b.line, b.kind, b.command, d))
		}
	}
	if write {
		return problems, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
	}
	return problems, nil
}

// parse finds the figure blocks, and reports text blocks without a marker and markers
// without a block.
func parse(lines []string) (blocks []block, problems []string) {
	for i := 0; i < len(lines); i++ {
		m := reFence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		var mk []string
		if i > 0 {
			mk = reMarker.FindStringSubmatch(lines[i-1])
		}
		switch {
		case mk != nil:
			b := block{kind: mk[1], command: mk[2], line: i, start: i + 1, end: end}
			if cmd, vol, ok := strings.Cut(b.command, " | volatile: "); ok {
				b.command = cmd
				for _, re := range strings.Fields(vol) {
					r, err := regexp.Compile(re)
					if err != nil {
						problems = append(problems, fmt.Sprintf("%d: volatile %q: %v", i, re, err))
						continue
					}
					b.volatile = append(b.volatile, r)
				}
			}
			blocks = append(blocks, b)
		case m[1] == "text":
			problems = append(problems, fmt.Sprintf("%d: a text block without a docs marker (<!-- docs:run|sample COMMAND --> on the line before): which command printed it?", i+1))
		}
		i = end
	}
	for i, l := range lines {
		if reMarker.MatchString(l) && (i+1 >= len(lines) || !reFence.MatchString(lines[i+1])) {
			problems = append(problems, fmt.Sprintf("%d: a docs marker not followed by a fenced block", i+1))
		}
	}
	return blocks, problems
}

// producer gives each block its output, running each distinct command once.
type producer struct {
	outputs map[string][]string // by kind and command
	run     func(command string) ([]byte, error)
}

// produce runs a block's command (or reads its file), or recalls its output, and
// returns its lines.
func (p *producer) produce(b block) ([]string, error) {
	key := b.kind + " " + b.command
	if out, ok := p.outputs[key]; ok {
		return out, nil
	}
	var out []byte
	var err error
	switch b.kind {
	case "file":
		out, err = os.ReadFile(b.command)
	case "run":
		out, err = p.run(b.command)
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	p.outputs[key] = lines
	return lines, nil
}

// runCommand runs command under bash with bin first on PATH and returns its output.
func runCommand(command, bin string) ([]byte, error) {
	cmd := exec.Command("bash", "-c", "set -o pipefail; "+command)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v after %v\n%s", err, time.Since(start).Round(time.Millisecond), stderr.Bytes())
	}
	return out, nil
}

// differ returns "" when got matches want, else the first difference. A line matching a
// volatile pattern matches with its numbers masked.
func differ(want, got []string, volatile []*regexp.Regexp) string {
	for i := 0; i < len(want) || i < len(got); i++ {
		switch {
		case i >= len(want):
			return fmt.Sprintf("line %d of the output is new: %q", i+1, got[i])
		case i >= len(got):
			return fmt.Sprintf("line %d is gone from the output: %q", i+1, want[i])
		case want[i] == got[i]:
		case isVolatile(want[i], volatile) && reDigits.ReplaceAllString(want[i], "#") == reDigits.ReplaceAllString(got[i], "#"):
		default:
			return fmt.Sprintf("line %d:\n\tdocument: %s\n\tnow:      %s", i+1, want[i], got[i])
		}
	}
	return ""
}

func isVolatile(line string, volatile []*regexp.Regexp) bool {
	for _, re := range volatile {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}
