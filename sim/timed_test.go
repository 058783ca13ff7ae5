package sim

import (
	"context"
	"math"
	"testing"

	"github.com/kvindex/kvindex/engine"
)

// TestTimedMatchesZeroTimeAtVanishingLoad is the differential test between the two
// models: at a vanishing load (speedup 1e-6, so every request finishes long before the
// next arrives) and one output token, the timed engines serve exactly what the
// zero-time mock engines serve, so a routing that ignores the caches (round-robin)
// gives exactly the zero-time hit counts, and so do the zero-time kv-aware's own
// decisions replayed. Where the routings draw random numbers differently (random),
// the mean hit rates over five seeds agree within three standard errors (the noise:
// the seeds' spread). The timed kv-aware is another policy (Dynamo's cost, ties
// broken at random, where the zero-time one caps request counts): its hit rate is
// logged beside, not compared. With real outputs (the trace's, never requested
// again), which pin more blocks while they decode, round-robin stays within half a
// point.
func TestTimedMatchesZeroTimeAtVanishingLoad(t *testing.T) {
	sequential(t)
	w, err := Generate(GenConfig{Seed: 3, Requests: 500, Sessions: 24})
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Workers: 4, Capacity: max(w.MaxSeqBlocks, 500), EventDelay: -1, Seed: 3, Engine: engine.Config{Shards: 1}}
	ctx := context.Background()
	zero := func(p Policy, w *Workload) Result {
		r, err := Run(ctx, w, p, base)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	timed := func(name string, w *Workload, output int) TimedResult {
		r, err := Simulate(ctx, w, mustRouting(t, name), TimedConfig{Config: base, Speedup: 1e-6, Output: output})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	z, tm := zero(RoundRobin, w), timed("round-robin", w, 1)
	if z.HitBlocks != tm.HitBlocks || z.ReusedTokens != tm.ReusedTokens || z.Blocks != tm.Blocks {
		t.Errorf("round-robin, one output token: timed hits %d/%d blocks, %d tokens reused; zero-time %d/%d, %d",
			tm.HitBlocks, tm.Blocks, tm.ReusedTokens, z.HitBlocks, z.Blocks, z.ReusedTokens)
	}
	if tm.Preemptions != 0 || tm.QueueMax != 0 {
		t.Errorf("vanishing load: %d preemptions, queue max %d", tm.Preemptions, tm.QueueMax)
	}
	// The zero-time kv-aware's own decisions, replayed under time: the engines serve
	// the same hits.
	force := make([]int, len(w.Requests))
	base.picked = func(i, w int) { force[i] = w }
	zk := zero(KVAware, w)
	base.picked, base.force = nil, force
	tk := timed("round-robin", w, 1)
	base.force = nil
	if zk.HitBlocks != tk.HitBlocks || zk.ReusedTokens != tk.ReusedTokens {
		t.Errorf("kv-aware's decisions, one output token: timed hits %d blocks, %d tokens reused; zero-time %d, %d",
			tk.HitBlocks, tk.ReusedTokens, zk.HitBlocks, zk.ReusedTokens)
	}
	var zs, ts []float64
	for seed := range uint64(5) {
		base.Seed = seed + 1
		zs = append(zs, zero(Random, w).BlockHitRate())
		ts = append(ts, timed("random", w, 1).BlockHitRate())
	}
	base.Seed = 3
	zm, zv := meanVar(zs)
	tm2, tv := meanVar(ts)
	if se := math.Sqrt(zv/5 + tv/5); math.Abs(zm-tm2) > 3*se+0.002 {
		t.Errorf("random: mean block hit over 5 seeds: zero-time %.4f, timed %.4f; more than 3 standard errors (%.4f) apart", zm, tm2, se)
	}
	t.Logf("random: mean block hit over 5 seeds: zero-time %.4f, timed %.4f", zm, tm2)

	recs := conversationTrace(t, 400)
	tw, err := FromTrace("trace", recs, 64)
	if err != nil {
		t.Fatal(err)
	}
	base.Capacity = max(tw.MaxSeqBlocks, 4096)
	zt, tt := zero(RoundRobin, tw), timed("round-robin", tw, 0)
	if d := math.Abs(zt.BlockHitRate() - tt.BlockHitRate()); d > 0.005 {
		t.Errorf("trace, round-robin with its outputs: timed block hit %.4f, zero-time %.4f", tt.BlockHitRate(), zt.BlockHitRate())
	}
	t.Logf("trace round-robin with outputs: timed %.4f, zero-time %.4f", tt.BlockHitRate(), zt.BlockHitRate())
}

// meanVar returns the mean and the sample variance of xs.
func meanVar(xs []float64) (mean, variance float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		variance += (x - mean) * (x - mean)
	}
	return mean, variance / float64(len(xs)-1)
}
