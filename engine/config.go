package engine

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/kvindex/kvindex/engine/internal/worker"
)

// Errors returned by the engine. Callers branch on them with errors.Is.
var (
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("engine: closed")
	// ErrParentNotFound rejects a stored event whose parent the worker does not hold.
	ErrParentNotFound = errors.New("engine: parent not found")
	// ErrInvalidEvent rejects a malformed event: an empty worker id, the same seq twice in
	// one stored event, a seq equal to the parent, too many blocks, or a chain deeper than
	// MaxDepth. Nothing of a rejected event is applied.
	ErrInvalidEvent = errors.New("engine: invalid event")
	// ErrQueryTooLong rejects a query of MaxDepth blocks or more: no chain can be that
	// deep, and a query is not an event (it changes nothing).
	ErrQueryTooLong = errors.New("engine: query too long")
	// ErrNotSpecChain refuses a query by prefix hashes (FindMatchesByPrefix) on an
	// engine whose positions are named by its own keyed chain, not SPEC's.
	ErrNotSpecChain = errors.New("engine: prefix-hash queries need the spec chain (Config.SpecChain)")
	// ErrInvalidConfig wraps every Config validation failure.
	ErrInvalidConfig = errors.New("engine: invalid config")
	// ErrNamespaceTableFull rejects a stored event or prediction that would intern a
	// namespace past Config.NamespaceBytes; it wraps ErrInvalidEvent. It lasts until a
	// sweep drops the names nothing uses (namespaces.go): a caller may retry later.
	ErrNamespaceTableFull = fmt.Errorf("%w: the namespace table is full", ErrInvalidEvent)
	// ErrShardFailed is returned once a shard goroutine has panicked; the engine is then
	// closed and its answers can no longer be vouched for.
	ErrShardFailed = errors.New("engine: shard failed")
)

// IsRejection reports whether err is the contract's rejection of an event
// (ErrParentNotFound or ErrInvalidEvent): the event changed nothing, and the caller may
// go on with the next one.
func IsRejection(err error) bool {
	return errors.Is(err, ErrParentNotFound) || errors.Is(err, ErrInvalidEvent)
}

// Limits on input. They bound the memory one call can make the engine use.
const (
	// MaxDepth bounds positions: a chain may be at most MaxDepth blocks long.
	MaxDepth = 1 << 30
	// MaxSegments bounds the segments one worker holds on one tier (runs of up to 64
	// consecutive positions of one chain: a one-block chain is one, a chain of 1,000
	// blocks 16): a stored or copied event that could pass it is rejected with
	// ErrInvalidEvent, and Restore refuses a snapshot that does. 2^26 - 1, a segment's
	// share of the 32-bit name a worker's tables give a block.
	MaxSegments = worker.MaxSegments
	// MaxShards bounds Config.Shards.
	MaxShards = 256
	// MaxJumpSize bounds Config.JumpSize.
	MaxJumpSize = 1 << 16
	// MaxQueueSize bounds Config.QueueSize.
	MaxQueueSize = 1 << 24
	// MaxQueuedDeltas bounds Shards x QueueSize: the rings are allocated up front at 16
	// bytes a cell (a 12-byte delta and its sequence word), so this caps them at 512 MiB.
	MaxQueuedDeltas = 1 << 25
	// MaxQueryQueue bounds Config.QueryQueue: each shard's query channel is allocated up
	// front at 8 bytes a cell, so this caps it at 512 KiB a shard.
	MaxQueryQueue = 1 << 16
	// MaxWorkerLen bounds a worker id in bytes (64 KiB, as a fabric message's names):
	// an event or prediction naming a longer one is rejected with ErrInvalidEvent. The
	// engine never holds a longer id, so no snapshot carries one, and Restore refuses
	// a snapshot that does: writer and reader share the bound.
	MaxWorkerLen = 1 << 16
	// MaxNamespaceLen bounds a namespace name in bytes (Event.Namespace: a model, LoRA
	// adapter and cache salt, escaped; real ones are tens of bytes): a stored event or
	// prediction in a longer one is rejected with ErrInvalidEvent, and a query in one
	// matches nothing. Like MaxWorkerLen, it bounds what a snapshot may carry.
	MaxNamespaceLen = 1 << 10
)

// Config configures an Engine. The zero value is valid: every zero field means its
// default. New never modifies the caller's Config.
type Config struct {
	// Shards is the number of shard goroutines that own the positional index.
	// Range 1..MaxShards. Default (0, with LockedIndex unset): chosen by the cores the
	// engine may use: the locked index (LockedIndex, Shards 1) where runtime.GOMAXPROCS(0)
	// is 1 or 2, else runtime.GOMAXPROCS(0) shards, at most 8. On two cores the shards
	// cost more CPU than they save: in ordered replay of the conversation trace
	// (kvindex replay --ops trace_conversation.jsonl --json --repeat 3, the replay's
	// process CPU time, six alternated runs on a 2-core machine; BENCHMARKS.md, "The
	// default index by cores") the locked index spent a median 0.020 s, 1 shard 0.072 s
	// and 2 shards 0.084 s: every event's deltas cross a ring to a shard goroutine that
	// polls and must be woken, and a query makes a round trip through the
	// shards. With more cores the shards apply events in parallel, which the locked
	// index cannot; scripts/scaling.sh measures where that starts to pay. Set Shards (1
	// or more) to run shard goroutines on any machine, or LockedIndex to run the locked
	// index on any machine.
	Shards int
	// JumpSize is the jump-search stride in blocks. Default 64. Range 1..MaxJumpSize.
	JumpSize int
	// QueueSize is the capacity of each shard's event ring, in index deltas; a producer
	// that finds a ring full waits (backpressure). Default 4096. A power of two, at
	// least 2, at most MaxQueueSize.
	QueueSize int
	// MaxEventBlocks bounds the blocks of one stored event and the seqs of one removed
	// event; larger events are rejected with ErrInvalidEvent. Default 1<<20.
	MaxEventBlocks int
	// QueryQueue is the capacity of each shard's query channel. Default 256. Range
	// 1..MaxQueryQueue.
	QueryQueue int
	// LockedIndex replaces the shard goroutines with a single index guarded by one
	// readers-writer lock (package internal/rwlock: an uncontended write costs one
	// compare-and-swap each way): event callers apply their events under the write
	// lock (workers' tables and index alike, so events of different workers take
	// turns) and queries read under the read lock, on their own goroutines. Its index
	// keeps only the positions a query probes (below 16, and every 64th); a query reads
	// the rest of a candidate's last stride from the worker's own tables, so a run of
	// block changes inside a stride costs the index at most one. Shards must be 0 or 1
	// with it.
	//
	// The zero Config runs it on one or two cores (Shards says why). On two cores it
	// applies one producer's events 3.4x as fast as one shard (5.6M against 1.65M
	// events/s on the conversation trace), holds the least memory (41 against 58 bytes
	// per membership), and an event is visible to every query that starts after its
	// call returns, with no Barrier; under two queriers and a streamer its find-matches
	// p99 is about one shard's (15.8 against 15.4 µs). At rest one shard answers as
	// fast. Choose shards (Shards >= 1) when events must not wait for queries: every
	// event takes the write lock for its whole bookkeeping, so a busy query load slows
	// events (378k events/s meanwhile against 1.08M at one shard), and with more cores
	// the shards apply events in parallel. BENCHMARKS.md ("LockedIndex or shards") has
	// the figures and their command.
	LockedIndex bool
	// SpecChain makes the engine name positions by SPEC's XXH3 prefix chain
	// (hash.Next) instead of its own keyed chain, which a query computes about five
	// times faster (DESIGN.md, "The prefix chain"). Answers are the same; snapshots
	// then carry no chain key. Restore ignores it: a restored engine keeps the chain
	// its snapshot was written with.
	SpecChain bool

	// PredictionsPerWorker bounds the live predictions of one worker (Predict); a new
	// one beyond it ends the worker's oldest. Default 64. Range 1..MaxPredictionsPerWorker.
	PredictionsPerWorker int
	// PredictedBlocks bounds the blocks of all predictions together (16 bytes each); a
	// new prediction beyond it ends the engine's oldest. Default 1<<20. Range
	// 1..MaxPredictedBlocks.
	PredictedBlocks int
	// PredictionTTL is the lifetime of a prediction made with ttl 0. Default 2s. Range
	// up to MaxPredictionTTL.
	PredictionTTL time.Duration
	// NamespaceBytes bounds the namespace table: each interned namespace name is
	// accounted its length plus 128 bytes, and a stored event that would intern past the
	// bound is rejected with ErrInvalidEvent (a prediction past half of it), until a
	// sweep drops the names no block and no live prediction uses (namespaces.go).
	// Default 64 MiB. Range 1 KiB..MaxNamespaceBytes.
	NamespaceBytes int64
	// Clock is the time predictions expire by (and namespace sweeps are paced by). nil (kept nil by WithDefaults, so that
	// Configs compare) means time.Now; tests inject theirs.
	Clock func() time.Time
}

// WithDefaults returns c with every zero field set to its default: the configuration
// New would run with.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Validate reports whether New would accept c (an error wrapping ErrInvalidConfig if
// not), without starting anything.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) withDefaults() Config {
	if c.Shards == 0 {
		if c.LockedIndex {
			c.Shards = 1
		} else {
			c.Shards, c.LockedIndex = defaultIndex(runtime.GOMAXPROCS(0))
		}
	}
	if c.JumpSize == 0 {
		c.JumpSize = 64
	}
	if c.QueueSize == 0 {
		c.QueueSize = 4096
	}
	if c.MaxEventBlocks == 0 {
		c.MaxEventBlocks = 1 << 20
	}
	if c.QueryQueue == 0 {
		c.QueryQueue = 256
	}
	if c.PredictionsPerWorker == 0 {
		c.PredictionsPerWorker = 64
	}
	if c.PredictedBlocks == 0 {
		c.PredictedBlocks = 1 << 20
	}
	if c.PredictionTTL == 0 {
		c.PredictionTTL = 2 * time.Second
	}
	if c.NamespaceBytes == 0 {
		c.NamespaceBytes = 64 << 20
	}
	return c
}

// lockedMaxProcs is the most runtime.GOMAXPROCS(0) at which the zero Config runs the
// locked index rather than shard goroutines (Config.Shards has the figures).
const lockedMaxProcs = 2

// defaultIndex is the index the zero Config runs on procs usable cores: the locked index
// up to lockedMaxProcs, else one shard per core, at most 8.
func defaultIndex(procs int) (shards int, locked bool) {
	if procs <= lockedMaxProcs {
		return 1, true
	}
	return min(procs, 8), false
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Shards < 1 || c.Shards > MaxShards:
		return bad("Shards = %d, want 1..%d", c.Shards, MaxShards)
	case c.JumpSize < 1 || c.JumpSize > MaxJumpSize:
		return bad("JumpSize = %d, want 1..%d", c.JumpSize, MaxJumpSize)
	case c.QueueSize < 2 || c.QueueSize > MaxQueueSize || c.QueueSize&(c.QueueSize-1) != 0:
		return bad("QueueSize = %d, want a power of two in 2..%d", c.QueueSize, MaxQueueSize)
	case c.MaxEventBlocks < 1:
		return bad("MaxEventBlocks = %d, want >= 1", c.MaxEventBlocks)
	case c.QueryQueue < 1 || c.QueryQueue > MaxQueryQueue:
		return bad("QueryQueue = %d, want 1..%d", c.QueryQueue, MaxQueryQueue)
	case int64(c.Shards)*int64(c.QueueSize) > MaxQueuedDeltas:
		return bad("Shards x QueueSize = %d, want at most %d", int64(c.Shards)*int64(c.QueueSize), MaxQueuedDeltas)
	case c.LockedIndex && c.Shards != 1:
		return bad("LockedIndex needs Shards = 1, not %d", c.Shards)
	case c.PredictionsPerWorker < 1 || c.PredictionsPerWorker > MaxPredictionsPerWorker:
		return bad("PredictionsPerWorker = %d, want 1..%d", c.PredictionsPerWorker, MaxPredictionsPerWorker)
	case c.PredictedBlocks < 1 || c.PredictedBlocks > MaxPredictedBlocks:
		return bad("PredictedBlocks = %d, want 1..%d", c.PredictedBlocks, MaxPredictedBlocks)
	case c.PredictionTTL < 0 || c.PredictionTTL > MaxPredictionTTL:
		return bad("PredictionTTL = %v, want 0..%v", c.PredictionTTL, MaxPredictionTTL)
	case c.NamespaceBytes < 1<<10 || c.NamespaceBytes > MaxNamespaceBytes:
		return bad("NamespaceBytes = %d, want %d..%d", c.NamespaceBytes, 1<<10, int64(MaxNamespaceBytes))
	}
	return nil
}
