package sim

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sharedDir finds a folder of the project's shared data (traces, conformance): under
// $KVINDEX_TRACES's parent when that is set, else shared/<name> above the package.
func sharedDir(t testing.TB, name, file string) string {
	t.Helper()
	var cands []string
	if d := os.Getenv("KVINDEX_TRACES"); d != "" {
		if name == "traces" {
			cands = append(cands, d)
		} else {
			cands = append(cands, filepath.Join(d, "..", name))
		}
	}
	cands = append(cands, filepath.Join("..", "..", "shared", name), filepath.Join("..", "..", "..", "shared", name))
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, file)); err == nil {
			return d
		}
	}
	t.Skipf("SKIP: %s not found in %v (set KVINDEX_TRACES to the traces folder)", filepath.Join(name, file), cands)
	return ""
}

// conversationTrace reads the first limit records (all if limit <= 0) of the Mooncake
// conversation trace, or skips the test visibly.
func conversationTrace(t testing.TB, limit int) []TraceRecord {
	t.Helper()
	d := sharedDir(t, "traces", "conversation_trace.jsonl")
	f, err := os.Open(filepath.Join(d, "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadTrace(f, limit)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
