package sim

import (
	"fmt"

	"github.com/kvindex/kvindex/hash"
)

// Defaults of llm-d's approximate prefix cache as the gateway-api-inference-extension
// ships it (pkg/epp/scheduling/framework/plugins/multi/prefix: DefaultBlockSizeTokens,
// DefaultLRUCapacityPerServer, DefaultMaxPrefixBlocks; the older character-keyed
// plugin hashed 64 characters, 16 tokens at its 4 characters per token).
const (
	// DefaultApproxBlock is the tokens one key of the approximate cache covers.
	DefaultApproxBlock = 16
	// DefaultApproxCapacity is the keys the approximate cache holds per engine: sized
	// for Llama-3-8B on an H100 (500,000 tokens), whatever the engine really holds.
	DefaultApproxCapacity = 31250
	// DefaultApproxMaxBlocks is the most keys of a prompt it hashes and matches: the
	// first 4,096 tokens at the default block.
	DefaultApproxMaxBlocks = 256
	// MaxApproxBlock bounds TimedConfig.ApproxBlock.
	MaxApproxBlock = 1 << 16
)

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
