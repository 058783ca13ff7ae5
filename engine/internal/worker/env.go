package worker

import (
	"fmt"
	"sync/atomic"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// Env is what a worker's bookkeeping needs of the engine that holds it: the engine's
// seeds and shard count, the counters its publication updates, and the registry that
// names its tier components. One Env per engine, set up before the engine's first
// event and passed by pointer to every method that needs it; a worker keeps no pointer
// to it (100,000 workers do not pay 8 bytes each for one).
type Env struct {
	// Set before the engine's first event, read-only after (any goroutine, concurrently):
	// Seed keys every table hash of the engine (the seq tables, the key indexes, the
	// fingerprints); Chain computes the prefix words of keys; Shards is the number of
	// shards the fingerprints are spread over (OwnerOf).
	Seed   table.Seed
	Chain  chain.Chain
	Shards int
	// Locked says the environment is the locked index's: its positional index keeps
	// only the positions a sparse walk probes (Indexed), whose queries read the rest of
	// a stride from the candidates' own tables (HeldRun), and every publication
	// (Publish, PublishGroups) runs under its write lock, so the block counts are
	// LockedBlocks, not TierBlocks.
	Locked bool

	// Register makes a new tier component of primary p for tier t (NewComponent) under
	// a worker id of the engine's registry, and returns it registered. Called by the
	// holder of p's mutex the first time p holds a block on tier t; it takes the
	// registry's lock (an event's worker mutex is taken before the registry's, never
	// after).
	Register func(p *Worker, t Tier) *Worker

	// TierBlocks counts the entries of every worker (seq tables and declared groups) per
	// tier; their sum is the engine's block count (one atomic add per publication, not
	// two). Atomics: added to by the holder of a worker's mutex when it publishes
	// (Publish, PublishGroups), read by anyone (the engine's Stats). Unused when Locked.
	TierBlocks [NumTiers]atomic.Int64
	// LockedBlocks is TierBlocks on the locked index (Locked): plain words, added to
	// under its write lock and read under its read lock. With the event and skipped
	// counts made plain words too, bench's BenchmarkEvents (locked, one call per event)
	// went from 248-258 to 232-240 ns an event (three alternating runs).
	LockedBlocks [NumTiers]int64
}

// addBlocks adds d to tier t's block count: the holder of a worker's mutex when it
// publishes (and, when env.Locked, of the locked index's write lock).
func (env *Env) addBlocks(t Tier, d int64) {
	if env.Locked {
		env.LockedBlocks[t] += d
		return
	}
	env.TierBlocks[t].Add(d)
}

// Blocks is tier t's block count: any goroutine, but when env.Locked only under the
// locked index's read (or write) lock.
func (env *Env) Blocks(t Tier) int64 {
	if env.Locked {
		return env.LockedBlocks[t]
	}
	return env.TierBlocks[t].Load()
}

// The sparse index's positions: every position below SparseHead (where most queries
// end: a router's system prompt) and every multiple of SparseStride (a segment's
// stride, where every block starts a segment and so is in its worker's key index).
const (
	SparseHead   = 16
	SparseStride = segMax
)

// Indexed reports whether the positional index holds keys at position pos: every
// position, or on the locked index's sparse one (Locked) the head and the stride
// anchors. Concurrent.
func (env *Env) Indexed(pos uint32) bool {
	return !env.Locked || pos < SparseHead || pos%SparseStride == 0
}

// Fingerprint is k's name in the positional index (shard.Hash). Concurrent.
func (env *Env) Fingerprint(k shard.Key) uint64 { return shard.Hash(env.Seed, k) }

// fingerprint is Fingerprint of a table key.
func (env *Env) fingerprint(k key) uint64 {
	return shard.Hash(env.Seed, shard.Key{Prefix: k.prefix, Pos: k.pos, NS: k.ns})
}

// OwnerOf returns the shard that owns the key with fingerprint fp. Keys are spread by a
// hash of all of the key, so the hot first positions that every request shares land on
// different shards. The shard takes the fingerprint's low bits and the shard's table
// its high bits, so that the keys of one shard still spread over the whole table.
// Concurrent.
func (env *Env) OwnerOf(fp uint64) int {
	return int((uint64(uint32(fp)) * uint64(env.Shards)) >> 32)
}

// Tier is the storage tier of a table: the engine's Tier (device 0, host 1, disk 2).
type Tier uint8

// Device is the tier of a named worker; its components hold the others.
const Device Tier = 0

// NumTiers is the number of tiers (the engine's NumTiers).
const NumTiers = 3

// Block is one stored block: the engine's Block (the engine converts its events'
// slices to this type without copying; its conversion check fails to compile if the
// two ever differ).
type Block struct {
	Content uint64
	Seq     uint64
}

var tierNames = [NumTiers]string{"device", "host", "disk"}

// String returns the tier's name, as the engine's Tier does.
func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}
