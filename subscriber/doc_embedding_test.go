package subscriber_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocEmbeddingCompiles: docs/library.md's "Embedding in a Go router" code is
// followAndMatch of example_test.go, and its "Picking a worker" code is pickWorker and
// candidates, character for character, so they compile and run (Example,
// Example_pickWorker) with every go test.
func TestDocEmbeddingCompiles(t *testing.T) {
	readme, err := os.ReadFile("../docs/library.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"followAndMatch", "pickWorker"} {
		begin, end := "// README:begin "+name+"\n", "\n// README:end "+name
		s := string(src)
		i, j := strings.Index(s, begin), strings.Index(s, end)
		if i < 0 || j < i {
			t.Fatalf("example_test.go lacks the README markers of %s", name)
		}
		code := s[i+len(begin) : j]
		if !strings.Contains(string(readme), "```go\n"+code+"```\n") {
			t.Errorf("docs/library.md's code differs from %s in example_test.go; paste this:\n```go\n%s```", name, code)
		}
	}
}
