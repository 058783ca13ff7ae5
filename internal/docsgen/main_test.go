package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParse: a marker's block is found with its command and volatile patterns; a text
// block without a marker and a marker without a block are reported.
func TestParse(t *testing.T) {
	doc := strings.Split("<!-- docs:run kvindex sim | volatile: ^total ^\\s+x -->\n```text\na\ntotal 1 s\n```\n\n```text\nunmarked\n```\n<!-- docs:sample kvindex demo -->\nno block\n```go\nx\n```", "\n")
	blocks, problems := parse(doc)
	if len(blocks) != 1 || blocks[0].command != "kvindex sim" || len(blocks[0].volatile) != 2 ||
		blocks[0].start != 2 || blocks[0].end != 4 || blocks[0].kind != "run" {
		t.Fatalf("blocks %+v", blocks)
	}
	if len(problems) != 2 || !strings.Contains(problems[0], "without a docs marker") || !strings.Contains(problems[1], "not followed by a fenced block") {
		t.Fatalf("problems %q", problems)
	}
}

// TestDiffer: deterministic lines must be equal; volatile ones equal up to their digits;
// lines added or lost are differences.
func TestDiffer(t *testing.T) {
	vol := []*regexp.Regexp{regexp.MustCompile(`^total`)}
	for _, tc := range []struct {
		want, got []string
		same      bool
	}{
		{[]string{"hit 42.5%", "total 3.1 s"}, []string{"hit 42.5%", "total 27.0 s"}, true},
		{[]string{"hit 42.5%"}, []string{"hit 42.6%"}, false},
		{[]string{"total 3.1 s"}, []string{"total 3.1 ms"}, false},
		{[]string{"a"}, []string{"a", "b"}, false},
		{[]string{"a", "b"}, []string{"a"}, false},
	} {
		if d := differ(tc.want, tc.got, vol); (d == "") != tc.same {
			t.Errorf("differ(%q, %q) = %q, want same %v", tc.want, tc.got, d, tc.same)
		}
	}
}

// TestProcessChecksAndRewrites: two documents quoting one command are checked against
// one run of it; a document whose figures the command no longer prints fails (with
// its volatile lines equal up to their digits) until -write rewrites it, after which
// it passes.
func TestProcessChecksAndRewrites(t *testing.T) {
	dir := t.TempDir()
	doc := "intro\n<!-- docs:run kvindex sim | volatile: ^total -->\n```text\n%s\ntotal 9.9 s\n```\nafter\n"
	readme, simReadme := filepath.Join(dir, "README.md"), filepath.Join(dir, "sim-README.md")
	for _, f := range []string{readme, simReadme} {
		if err := os.WriteFile(f, []byte(strings.Replace(doc, "%s", "p90 76 ms", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runs := 0
	output := "p90 76 ms\ntotal 123.4 s\n"
	p := &producer{outputs: map[string][]string{}, run: func(command string) ([]byte, error) {
		runs++
		if command != "kvindex sim" {
			t.Errorf("ran %q", command)
		}
		return []byte(output), nil
	}}
	for _, f := range []string{readme, simReadme} {
		if problems, err := process(f, p, false); err != nil || len(problems) != 0 {
			t.Fatalf("%s: %v %q", f, err, problems)
		}
	}
	if runs != 1 {
		t.Errorf("the command ran %d times for two documents, want once", runs)
	}
	// The default run changes: both documents fail until rewritten.
	output = "p90 80 ms\ntotal 1.0 s\n"
	p.outputs = map[string][]string{}
	problems, err := process(simReadme, p, false)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0], "p90 76 ms") || !strings.Contains(problems[0], "p90 80 ms") {
		t.Fatalf("changed output: %v %q", err, problems)
	}
	if problems, err := process(simReadme, p, true); err != nil || len(problems) != 0 {
		t.Fatalf("-write: %v %q", err, problems)
	}
	got, _ := os.ReadFile(simReadme)
	if want := strings.Replace(doc, "%s\ntotal 9.9 s", "p90 80 ms\ntotal 1.0 s", 1); string(got) != want {
		t.Errorf("rewritten:\n%s\nwant:\n%s", got, want)
	}
	if problems, err := process(simReadme, p, false); err != nil || len(problems) != 0 {
		t.Fatalf("after -write: %v %q", err, problems)
	}
}
