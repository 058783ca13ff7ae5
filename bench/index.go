package bench

import (
	"context"
	"fmt"

	"github.com/kvindex/kvindex/bench/radix"
	"github.com/kvindex/kvindex/engine"
)

// Index is an index under test. Apply and FindMatches may be called concurrently, with
// one worker's events applied from one goroutine at a time; Sync, Blocks and Close are
// called when nothing else runs.
type Index interface {
	// Apply applies one event. A rejection of the contract (see IsRejection) is an
	// answer, not a failure.
	Apply(ev *engine.Event) error
	// FindMatches appends the query's answer to dst, ordered as engine.FindMatches
	// orders it.
	FindMatches(content []uint64, dst []engine.Match) ([]engine.Match, error)
	// Sync returns once every event applied before it is visible to queries.
	Sync() error
	// Blocks returns the sum of the workers' sizes (after a Sync).
	Blocks() int64
	// Close releases the index and every goroutine it started.
	Close() error
}

// queryWorker is an Index that counts its queries' round trips and probes (the engine).
type queryWorker interface {
	QueryWork() (rounds, probes uint64, ok bool)
}

// Impl names an implementation and makes fresh instances of it.
type Impl struct {
	// Name is a sub-benchmark name: "engine/shards=N", "locked", "locked/spec-chain" or "radix".
	Name string
	// New returns an empty index.
	New func() (Index, error)
}

// EngineImpl is the sharded engine with the given shard count (default jump size and
// queue size).
func EngineImpl(shards int) Impl {
	return engineImpl(fmt.Sprintf("engine/shards=%d", shards), engine.Config{Shards: shards})
}

// LockedImpl is the engine's LockedIndex baseline: the same positional index behind one
// readers-writer lock, applied by the event callers, with no shard goroutines.
func LockedImpl() Impl { return engineImpl("locked", engine.Config{LockedIndex: true}) }

// LockedSpecImpl is LockedImpl with SPEC's XXH3 prefix chain instead of the engine's
// keyed one (engine.Config.SpecChain): beside LockedImpl in one run it measures what the
// chain alone costs.
func LockedSpecImpl() Impl {
	return engineImpl("locked/spec-chain", engine.Config{LockedIndex: true, SpecChain: true})
}

// engineImpl names an engine configuration.
func engineImpl(name string, cfg engine.Config) Impl {
	return Impl{Name: name, New: func() (Index, error) { return newEngineIndex(cfg) }}
}

// RadixImpl is the mutex-guarded radix tree of package radix.
func RadixImpl() Impl {
	return Impl{Name: "radix", New: func() (Index, error) { return &radixIndex{x: radix.New()}, nil }}
}

// Impls returns EngineImpl for each shard count, then LockedImpl and RadixImpl.
func Impls(shards []int) []Impl {
	var out []Impl
	for _, s := range shards {
		out = append(out, EngineImpl(s))
	}
	return append(out, LockedImpl(), RadixImpl())
}

type engineIndex struct{ e *engine.Engine }

func newEngineIndex(cfg engine.Config) (Index, error) {
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	return engineIndex{e}, nil
}

func (x engineIndex) Apply(ev *engine.Event) error { return x.e.Apply(ev) }

func (x engineIndex) FindMatches(content []uint64, dst []engine.Match) ([]engine.Match, error) {
	return x.e.FindMatches(context.Background(), content, dst)
}

// QueryWork returns the engine's counts of the round trips and probes its queries
// made so far (engine.Stats.QueryRounds, QueryProbes); ok is false for the locked
// index and a one-shard engine, whose queries walk the index directly (counting
// neither, but for the one shard's jump-search fallbacks).
func (x engineIndex) QueryWork() (rounds, probes uint64, ok bool) {
	st := x.e.Stats()
	cfg := x.e.Config()
	return st.QueryRounds, st.QueryProbes, !cfg.LockedIndex && cfg.Shards > 1
}

func (x engineIndex) Sync() error   { return x.e.Barrier(context.Background()) }
func (x engineIndex) Blocks() int64 { return x.e.Stats().Blocks }
func (x engineIndex) Close() error  { return x.e.Close() }

type radixIndex struct{ x *radix.Index }

func (r *radixIndex) Apply(ev *engine.Event) error { return r.x.Apply(ev) }

func (r *radixIndex) FindMatches(content []uint64, dst []engine.Match) ([]engine.Match, error) {
	return r.x.FindMatches(content, dst), nil
}

func (r *radixIndex) Sync() error   { return nil } // events are applied before Apply returns
func (r *radixIndex) Blocks() int64 { return r.x.Stats().Blocks }
func (r *radixIndex) Close() error  { return nil }
