package subscriber_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocEmbeddingCompiles: docs/library.md's "Embedding in a Go router" code is
// followAndMatch of example_test.go, character for character, so it compiles and runs
// (Example) with every go test.
func TestDocEmbeddingCompiles(t *testing.T) {
	readme, err := os.ReadFile("../docs/library.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "// README:begin followAndMatch\n", "\n// README:end followAndMatch"
	s := string(src)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("example_test.go lacks the README markers")
	}
	code := s[i+len(begin) : j]
	if !strings.Contains(string(readme), "```go\n"+code+"```\n") {
		t.Fatalf("docs/library.md's embedding code differs from followAndMatch in example_test.go; paste this:\n```go\n%s```", code)
	}
}
