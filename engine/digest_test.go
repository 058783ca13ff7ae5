package engine_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/stretchr/testify/require"
)

// heldKey is the reference model's held set of a worker as a digest covers it: (group,
// tier, seq, depth) for each entry (see engine.Digest: the prefix a seq is held under is
// not covered, only its depth).
func heldKey(m *refmodel.Model, name string) string {
	var b strings.Builder
	for _, h := range m.Held(name) {
		fmt.Fprintf(&b, "%d/%d/%d/%d;", h.Group, h.Tier, h.Seq, h.Depth)
	}
	return b.String()
}

// digestReplica is one way of applying a history to an engine.
type digestReplica struct {
	name  string
	cfg   engine.Config
	batch int // events per ApplyBatch call; 1: Apply
	e     *engine.Engine
	queue []engine.Event
}

func (r *digestReplica) apply(t *testing.T, ev engine.Event) {
	if r.batch <= 1 {
		if err := r.e.Apply(&ev); err != nil && !engine.IsRejection(err) {
			t.Fatal(err)
		}
		return
	}
	r.queue = append(r.queue, ev)
	if len(r.queue) >= r.batch {
		r.flush(t)
	}
}

func (r *digestReplica) flush(t *testing.T) {
	for _, err := range r.e.ApplyBatch(r.queue, nil) {
		if err != nil && !engine.IsRejection(err) {
			t.Fatal(err)
		}
	}
	r.queue = r.queue[:0]
}

// TestDigestDifferential applies random histories (plain workers with and without host
// and disk events; hybrid workers with groups) to engines that differ in everything but
// the events: shard counts, the locked index, SPEC's chain, one event a call or batches
// of 7 or 64, a history whose workers' events are interleaved in another order, and an
// engine restored from a snapshot taken halfway. At checkpoints every engine's digests
// must be equal, every worker's Blocks the model's size, and every engine's incremental
// digests equal to their recount from its tables (CheckWorkers). Over all the
// checkpoints of all the histories, two workers' digests are equal exactly when the
// model's held sets are (as the digest covers them: group, tier, seq and depth).
func TestDigestDifferential(t *testing.T) {
	n := testsize.Sized(2000, 600, 300)
	if testing.Short() && n > 600 {
		n = 600
	}
	byDigest := map[uint64]string{}
	byHeld := map[string]uint64{}
	states := 0
	for hi, hist := range []struct {
		name string
		ops  func(seed uint64) []oplog.Op
	}{
		{"plain", func(seed uint64) []oplog.Op {
			return refmodel.RandomOps(rand.New(rand.NewPCG(seed, 31)), n, refmodel.RandomOptions{MaxChain: 60})
		}},
		{"tiers", func(seed uint64) []oplog.Op {
			return refmodel.RandomOps(rand.New(rand.NewPCG(seed, 32)), n, refmodel.RandomOptions{MaxChain: 60, Tiers: true})
		}},
		{"hybrid", func(seed uint64) []oplog.Op {
			return refmodel.RandomHybridOps(rand.New(rand.NewPCG(seed, 33)), n, refmodel.HybridOptions{Tiers: true})
		}},
	} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", hist.name, seed), func(t *testing.T) {
				var ops []oplog.Op
				for _, op := range hist.ops(seed + uint64(hi)*100) {
					if op.Kind != oplog.Query {
						ops = append(ops, op)
					}
				}
				replicas := []*digestReplica{
					{name: "shards=1", cfg: engine.Config{Shards: 1}, batch: 1},
					{name: "shards=3/batch=7", cfg: engine.Config{Shards: 3, QueueSize: 4}, batch: 7},
					{name: "locked", cfg: engine.Config{LockedIndex: true}, batch: 1},
					{name: "spec/batch=64", cfg: engine.Config{Shards: 2, SpecChain: true}, batch: 64},
				}
				for _, r := range replicas {
					r.e = newEngine(t, r.cfg)
				}
				m := refmodel.New()
				check := func(at int) {
					for _, r := range replicas {
						r.flush(t)
					}
					want := replicas[0].e.Digests()
					for _, r := range replicas {
						got := r.e.Digests()
						require.Equal(t, want, got, "%s at op %d", r.name, at)
						require.Empty(t, engine.DiffDigests(want, got))
						require.NoError(t, engine.CheckWorkers(r.e), "%s at op %d", r.name, at)
					}
					for _, name := range m.Workers() {
						size, _ := m.Size(name)
						d := want[name]
						require.Equal(t, size, d.Blocks, "worker %s at op %d", name, at)
						held := heldKey(m, name)
						if old, ok := byDigest[d.Sum]; ok {
							require.Equal(t, old, held, "digest %x names two held sets", d.Sum)
						}
						if old, ok := byHeld[held]; ok {
							require.Equal(t, old, d.Sum, "held set %q has two digests", held)
						}
						byDigest[d.Sum], byHeld[held] = held, d.Sum
						states++
					}
				}
				for i := range ops {
					_ = m.Apply(&ops[i])
					for _, r := range replicas {
						r.apply(t, replay.Event(&ops[i]))
					}
					if i%97 == 0 {
						check(i)
					}
					if i == len(ops)/2 {
						// A replica restored from a snapshot of the first one joins here.
						var snap bytes.Buffer
						require.NoError(t, replicas[0].e.WriteSnapshot(&snap))
						re, err := engine.Restore(engine.Config{Shards: 2}, &snap, 0)
						require.NoError(t, err)
						t.Cleanup(func() { re.Close() })
						replicas = append(replicas, &digestReplica{name: "restored", e: re, batch: 1})
						check(i)
					}
				}
				check(len(ops))

				// The same events, each worker's in its order, the workers interleaved
				// otherwise: the same held state, the same digests.
				perWorker := map[string][]oplog.Op{}
				var names []string
				for _, op := range ops {
					if perWorker[op.Worker] == nil {
						names = append(names, op.Worker)
					}
					perWorker[op.Worker] = append(perWorker[op.Worker], op)
				}
				r := rand.New(rand.NewPCG(seed, 7))
				shuffled := newEngine(t, engine.Config{Shards: 2})
				for len(names) > 0 {
					j := r.IntN(len(names))
					op := perWorker[names[j]][0]
					perWorker[names[j]] = perWorker[names[j]][1:]
					if len(perWorker[names[j]]) == 0 {
						names = append(names[:j], names[j+1:]...)
					}
					ev := replay.Event(&op)
					if err := shuffled.Apply(&ev); err != nil && !engine.IsRejection(err) {
						t.Fatal(err)
					}
				}
				require.Equal(t, replicas[0].e.Digests(), shuffled.Digests())
			})
		}
	}
	t.Logf("%d states, %d held sets", states, len(byHeld))
	require.Greater(t, len(byHeld), states/20, "the histories should reach many distinct held sets")
}

// TestDigestCases checks what a digest tells apart and what it does not, case by case:
// a chain stored in one event or block by block, evicted in any order, is the same;
// one block more or less, a seq at another depth, on another tier or in another
// namespace is not; a clear empties it; per-namespace digests equal those of an engine
// fed only that namespace, and sum to the worker's.
func TestDigestCases(t *testing.T) {
	chain := func(n int, seq0 uint64) []engine.Block {
		b := make([]engine.Block, n)
		for i := range b {
			b[i] = engine.Block{Content: uint64(i % 3), Seq: seq0 + uint64(i)}
		}
		return b
	}
	storeIn := func(e *engine.Engine, ns, w string, blocks []engine.Block) error {
		return e.Apply(&engine.Event{Kind: engine.EventStored, Worker: w, Namespace: ns, Blocks: blocks})
	}
	digest := func(e *engine.Engine, w string) engine.WorkerDigest {
		t.Helper()
		d, ok := e.Digest(w)
		require.True(t, ok)
		return d
	}
	// One event, or one block an event under its parent; evictions in two orders.
	a := newEngine(t, engine.Config{Shards: 2})
	b := newEngine(t, engine.Config{LockedIndex: true})
	require.NoError(t, a.Store("w", chain(10, 100)))
	require.NoError(t, b.Store("w", chain(1, 100)))
	for i := 1; i < 10; i++ {
		require.NoError(t, b.StoreUnder("w", uint64(100+i-1), chain(10, 100)[i:i+1]))
	}
	require.Equal(t, digest(a, "w"), digest(b, "w"))
	require.NoError(t, a.Remove("w", 105, 103, 109))
	for _, s := range []uint64{109, 105, 103} {
		require.NoError(t, b.Remove("w", s))
	}
	da := digest(a, "w")
	require.Equal(t, da, digest(b, "w"))
	require.Equal(t, 7, da.Blocks)
	require.NoError(t, b.Remove("w", 104))
	require.NotEqual(t, da.Sum, digest(b, "w").Sum, "one block less")
	require.NoError(t, b.StoreUnder("w", 103-1, chain(10, 100)[3:4]))
	require.NoError(t, b.StoreUnder("w", 103, chain(10, 100)[4:5]))
	require.NotEqual(t, da.Sum, digest(b, "w").Sum, "one block more")
	require.NoError(t, b.Remove("w", 103))
	require.Equal(t, da, digest(b, "w"), "back to the same blocks")

	// The same seq at another depth (its parent gone), on another tier.
	c := newEngine(t, engine.Config{Shards: 1})
	require.NoError(t, c.Store("deep", []engine.Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}}))
	require.NoError(t, c.Remove("deep", 1))
	require.NoError(t, c.Store("root", []engine.Block{{Content: 2, Seq: 2}}))
	require.NoError(t, c.Apply(&engine.Event{Kind: engine.EventStored, Worker: "host", Tier: engine.TierHost, Blocks: []engine.Block{{Content: 2, Seq: 2}}}))
	deep, root, host := digest(c, "deep"), digest(c, "root"), digest(c, "host")
	require.Equal(t, 1, deep.Blocks)
	require.NotEqual(t, deep.Sum, root.Sum)
	require.NotEqual(t, root.Sum, host.Sum)

	// Namespaces: per namespace as an engine fed that namespace alone; the worker's is
	// their sum; the same blocks in another namespace differ.
	d := newEngine(t, engine.Config{Shards: 2})
	only := newEngine(t, engine.Config{Shards: 1})
	other := newEngine(t, engine.Config{Shards: 1})
	for i := range 6 {
		ns := []string{"m1", "m2;lora=x"}[i%2]
		blocks := chain(5, uint64(1000*i))
		require.NoError(t, storeIn(d, ns, "w", blocks))
		if ns == "m1" {
			require.NoError(t, storeIn(only, ns, "w", blocks))
			require.NoError(t, storeIn(other, "m3", "w", blocks))
		}
	}
	dd, od := digest(d, "w"), digest(only, "w")
	require.Len(t, dd.Namespaces, 2)
	require.Equal(t, od.Namespaces["m1"], dd.Namespaces["m1"])
	require.Equal(t, dd.Namespaces["m1"].Sum+dd.Namespaces["m2;lora=x"].Sum, dd.Sum)
	require.Equal(t, 30, dd.Blocks)
	require.NotEqual(t, od.Sum, digest(other, "w").Sum, "another namespace")
	nsd := engine.NamespaceDigests(d.Digests())
	require.Equal(t, engine.NamespaceDigests(only.Digests())["m1"], nsd["m1"])

	// A clear empties the digest; a removed worker has none.
	require.NoError(t, d.Clear("w"))
	require.Equal(t, engine.WorkerDigest{Namespaces: map[string]engine.Digest{}}, digest(d, "w"))
	require.NoError(t, d.RemoveWorker("w"))
	_, ok := d.Digest("w")
	require.False(t, ok)
	require.Equal(t, []string{"w"}, engine.DiffDigests(only.Digests(), d.Digests()))
	require.Empty(t, engine.DiffDigests(map[string]engine.WorkerDigest{"x": {}}, nil), "an empty worker does not differ from an unknown one")
}

// TestDigestZeroAllocsNamespaced: a worker storing and evicting blocks outside the
// default namespace, emptying it each time, keeps its digests without allocating.
func TestDigestZeroAllocsNamespaced(t *testing.T) {
	testsize.SkipAllocs(t)
	e := newEngine(t, engine.Config{Shards: 2})
	blocks := make([]engine.Block, 16)
	seqs := make([]uint64, 16)
	for i := range blocks {
		blocks[i] = engine.Block{Content: uint64(i), Seq: uint64(50 + i)}
		seqs[i] = uint64(50 + i)
	}
	ev := engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: "model-a", Blocks: blocks[:8]}
	require.NoError(t, e.Apply(&ev)) // the namespace's cell exists
	ev.Blocks = blocks
	require.NoError(t, e.Store("w", []engine.Block{{Content: 9, Seq: 9}}))
	allocs := testing.AllocsPerRun(200, func() {
		if err := e.Apply(&ev); err != nil {
			t.Fatal(err)
		}
		for _, s := range seqs {
			if err := e.Remove("w", s); err != nil {
				t.Fatal(err)
			}
		}
	})
	require.Zero(t, allocs)
	d, _ := e.Digest("w")
	require.Equal(t, 1, d.Blocks)
}
