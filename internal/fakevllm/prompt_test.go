package fakevllm

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/hash"
)

// TestSystemPromptTokens: the tokens SystemPrompt returns hash, block by block, to the
// content hashes the engines publish for that prompt.
func TestSystemPromptTokens(t *testing.T) {
	f, err := NewFleet(FleetConfig{Engines: 1, Workload: Workload{BlockSize: 4, SystemBlocks: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.SystemPrompts() != len(f.prompts.sys) || f.SystemPrompts() == 0 {
		t.Fatalf("%d system prompts", f.SystemPrompts())
	}
	for i := range f.SystemPrompts() {
		toks := f.SystemPrompt(i)
		var got []uint64
		for b := range slices.Chunk(toks, 4) {
			got = append(got, hash.Content(b))
		}
		if !slices.Equal(got, f.prompts.sys[i].content) {
			t.Fatalf("prompt %d: tokens hash to %v, the engines publish %v", i, got, f.prompts.sys[i].content)
		}
	}
}
