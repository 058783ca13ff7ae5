package tokoracle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOneProcessRecovers: requests share one node process; a request that kills it
// is an error carrying node's message, and the next request starts a new process.
func TestOneProcessRecovers(t *testing.T) {
	dir := Install(t)
	ok := Run(t, []Job{{Model: "llama2", Text: "hello"}}, nil)
	mu.Lock()
	first := proc
	mu.Unlock()
	if again := Run(t, []Job{{Model: "llama2", Text: "hello"}}, nil); len(again.IDs[0]) != len(ok.IDs[0]) {
		t.Fatalf("second answer %v, first %v", again.IDs, ok.IDs)
	}
	mu.Lock()
	same := proc == first
	mu.Unlock()
	if !same {
		t.Fatal("a second request started another node process")
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ask(dir, bad); err == nil || !strings.Contains(err.Error(), "SyntaxError") {
		t.Fatalf("a request node cannot parse: %v, want node's SyntaxError", err)
	}
	if res := Run(t, []Job{{Model: "llama2", Text: "hello"}}, nil); len(res.IDs) != 1 || len(res.IDs[0]) != len(ok.IDs[0]) {
		t.Fatalf("after a failure: %v, want %v", res.IDs, ok.IDs)
	}
}
