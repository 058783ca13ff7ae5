package fakevllm

// SystemPrompts returns how many system prompts the fleet's sessions start from.
func (f *Fleet) SystemPrompts() int { return len(f.prompts.sys) }

// SystemPrompt returns the token ids of system prompt i (SystemBlocks blocks of
// BlockSize tokens): a prompt every engine whose sessions use it holds in its cache, and
// so a query that /v1/match answers with those engines (kvindex demo prints one). It
// panics for i out of range, as an index does.
func (f *Fleet) SystemPrompt(i int) []uint32 {
	c := &f.prompts.sys[i]
	bs := f.cfg.Workload.BlockSize
	out := make([]uint32, 0, len(c.seeds)*bs)
	for pos, seed := range c.seeds {
		out = appendTokens(out, seed, pos, bs)
	}
	return out
}
