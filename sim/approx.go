package sim

import (
	"fmt"

	"github.com/kvindex/kvindex/hash"
)

// Defaults of llm-d's approximate prefix cache as llm-d-router ships it
// (pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix: defaultConfig
// with autoTune on, GetBlockSize, makeserver). Auto-tuned, the cache keys the prompt in
// the engines' own KV block size, never under minBlockSizeTokens (64), holds per engine
// as many keys as the engine reports KV blocks (vLLM's num_gpu_blocks), and matches
// prompts up to maxPrefixTokensToMatch (131,072 tokens). The fixed defaults it falls
// back on without the engines' metrics, 31,250 keys of 16 tokens and the first 256 keys
// matched (4,096 tokens), are what --approx-capacity 31250 --approx-block 16 run.
const (
	// MinApproxBlock is the smallest key auto-tuning takes, in tokens (llm-d's
	// minBlockSizeTokens).
	MinApproxBlock = 64
	// DefaultApproxMaxTokens is the longest prefix matched, in tokens (llm-d's
	// defaultMaxPrefixTokens).
	DefaultApproxMaxTokens = 131072
	// MaxApproxBlock bounds TimedConfig.ApproxBlock.
	MaxApproxBlock = 1 << 16
)

// Approx returns approximate-lru's key size in tokens, its capacity per engine in
// keys and the most keys of a prompt it matches, for engines of blockSize-token
// blocks: the config's, or where zero llm-d's auto-tuned ones (the engines' block
// size, or its least multiple of at least MinApproxBlock tokens, so that a key is
// whole engine blocks; the engines' capacity in blocks; DefaultApproxMaxTokens).
func (c TimedConfig) Approx(blockSize int) (block, capacity, maxBlocks int) {
	block, capacity, maxBlocks = c.ApproxBlock, c.ApproxCapacity, c.ApproxMaxBlocks
	if block == 0 {
		block = max(blockSize, 1)
		block *= (MinApproxBlock + block - 1) / block
	}
	if capacity == 0 {
		capacity = c.Capacity
		if capacity == 0 {
			capacity = DefaultTimedCapacity
		}
	}
	if maxBlocks == 0 {
		maxBlocks = max(DefaultApproxMaxTokens/block, 1)
	}
	return block, capacity, maxBlocks
}

// checkApproxBlock reports whether an approximate block of approx tokens can be cut
// from engine blocks of engine tokens: one must divide the other.
func checkApproxBlock(approx, engine int) error {
	if approx < 1 || approx > MaxApproxBlock || (engine%approx != 0 && approx%engine != 0) {
		return fmt.Errorf("%w: approximate block %d tokens, want 1..%d dividing or divided by the block size %d", ErrConfig, approx, MaxApproxBlock, engine)
	}
	return nil
}

// approxKeys appends to dst the content keys of the request's prompt as the
// approximate cache cuts it, at most maxBlocks of them: blocks of approx tokens
// derived from the engine blocks' content hashes (a smaller block is one of the
// engine block's equal parts, a larger one the fold of the engine blocks it spans).
// The prompt's tokens past its last full engine block are not keyed.
func approxKeys(dst, blocks []uint64, engine, approx, maxBlocks int) []uint64 {
	switch {
	case approx == engine:
		return append(dst, blocks[:min(len(blocks), maxBlocks)]...)
	case approx < engine:
		parts := engine / approx
		for _, b := range blocks {
			for k := range parts {
				if len(dst) == maxBlocks {
					return dst
				}
				dst = append(dst, hash.Next(b, uint64(k)))
			}
		}
		return dst
	}
	span := approx / engine
	for i := 0; i+span <= len(blocks) && len(dst) < maxBlocks; i += span {
		h := blocks[i]
		for _, b := range blocks[i+1 : i+span] {
			h = hash.Next(h, b)
		}
		dst = append(dst, h)
	}
	return dst
}

// engineBlocks converts a match of n approximate blocks to whole engine blocks.
func engineBlocks(n, engine, approx int) int { return n * approx / engine }
