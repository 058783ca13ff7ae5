package sim

import (
	"slices"
	"testing"
)

// TestApproxKeys: the approximate cache's keys follow the prompt's content at its own
// block size, so prompts that share a prefix share exactly the keys that prefix
// covers, and a match converts back to whole engine blocks.
func TestApproxKeys(t *testing.T) {
	a := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	b := []uint64{1, 2, 3, 4, 5, 60, 70, 80, 90, 100}
	common := func(x, y []uint64) int {
		n := 0
		for n < min(len(x), len(y)) && x[n] == y[n] {
			n++
		}
		return n
	}
	cases := []struct {
		approx, max        int
		keys, shared, back int // keys of a, keys shared with b, engine blocks they cover
	}{
		{64, 256, 10, 5, 5},
		{64, 3, 3, 3, 3},
		{16, 256, 40, 20, 5}, // four keys per engine block
		{16, 7, 7, 7, 1},
		{256, 256, 2, 1, 4}, // one key per four engine blocks; the tail is not keyed
		{128, 256, 5, 2, 4},
	}
	for _, c := range cases {
		ka := approxKeys(nil, a, 64, c.approx, c.max)
		kb := approxKeys(nil, b, 64, c.approx, c.max)
		if len(ka) != c.keys || common(ka, kb) != c.shared || engineBlocks(c.shared, 64, c.approx) != c.back {
			t.Errorf("block %d, at most %d: %d keys, %d shared (%d engine blocks); want %d, %d (%d)",
				c.approx, c.max, len(ka), common(ka, kb), engineBlocks(common(ka, kb), 64, c.approx), c.keys, c.shared, c.back)
		}
		if again := approxKeys(nil, a, 64, c.approx, c.max); !slices.Equal(ka, again) {
			t.Errorf("block %d: keys differ between calls", c.approx)
		}
		if slices.Contains(ka[:c.shared], 0) {
			t.Errorf("block %d: a zero key", c.approx)
		}
	}
	for _, bad := range []int{0, 48, 96, MaxApproxBlock + 1} {
		if checkApproxBlock(bad, 64) == nil {
			t.Errorf("approximate block %d accepted beside 64-token blocks", bad)
		}
	}
}

// TestApproxAutoTuned: approximate-lru's defaults are llm-d-router's auto-tuned ones
// (approximateprefix: GetBlockSize, makeserver, defaultMaxPrefixTokens): the engines'
// block, at least 64 tokens; the engines' capacity; 131,072 tokens matched.
func TestApproxAutoTuned(t *testing.T) {
	for _, c := range []struct {
		cfg                        TimedConfig
		engineBlock                int
		block, capacity, maxBlocks int
	}{
		{TimedConfig{Config: Config{Capacity: 4802}}, 64, 64, 4802, 2048},
		{TimedConfig{Config: Config{Capacity: 1000}}, 16, 64, 1000, 2048},
		{TimedConfig{Config: Config{Capacity: 1000}}, 48, 96, 1000, 1365},
		{TimedConfig{Config: Config{Capacity: 1000}}, 256, 256, 1000, 512},
		{TimedConfig{Config: Config{Capacity: 1000}, ApproxBlock: 16, ApproxCapacity: 31250, ApproxMaxBlocks: 256}, 64, 16, 31250, 256},
	} {
		b, capa, mb := c.cfg.Approx(c.engineBlock)
		if b != c.block || capa != c.capacity || mb != c.maxBlocks {
			t.Errorf("engine block %d, %+v: got %d, %d, %d; want %d, %d, %d", c.engineBlock, c.cfg.ApproxBlock,
				b, capa, mb, c.block, c.capacity, c.maxBlocks)
		}
		if checkApproxBlock(b, c.engineBlock) != nil {
			t.Errorf("engine block %d: auto-tuned key of %d tokens does not fit it", c.engineBlock, b)
		}
	}
}

// TestApproxLRUCapacity: told a smaller capacity than the engines', approximate-lru
// forgets sooner and hits less.
func TestApproxLRUCapacity(t *testing.T) {
	w, err := Generate(GenConfig{Seed: 4, Requests: 3000, Sessions: 96})
	if err != nil {
		t.Fatal(err)
	}
	cfg := TimedConfig{Config: Config{Workers: 4, Capacity: 2000, EventDelay: -1, Seed: 4}, Speedup: 0.05}
	tuned := simulate(t, w, "llmd-scorer/approx-lru", cfg)
	cfg.ApproxCapacity = 200
	small := simulate(t, w, "llmd-scorer/approx-lru", cfg)
	if !(small.BlockHitRate() < tuned.BlockHitRate()) {
		t.Errorf("block hit: 200 keys %.4f, auto-tuned (the engines' 2,000) %.4f; want fewer hits with less", small.BlockHitRate(), tuned.BlockHitRate())
	}
	t.Logf("approximate-lru block hit: auto-tuned %.4f, 200 keys %.4f", tuned.BlockHitRate(), small.BlockHitRate())
}
