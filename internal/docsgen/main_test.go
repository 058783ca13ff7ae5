package main

import (
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
