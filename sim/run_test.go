package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/testsize"
)

// small is a built-in workload that runs in well under a second and fills a fleet of
// 4 workers x 400 blocks of 16 tokens, so evictions happen.
func small(t testing.TB, requests int) *Workload {
	t.Helper()
	w, err := Generate(GenConfig{
		Seed: 11, Requests: requests, BlockSize: 16, SystemPrompts: 6, SystemTokens: [2]int{64, 512},
		Sessions: 48, UserTokens: [2]int{8, 128}, ReplyTokens: [2]int{16, 192}, MaxContext: 3072,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var smallCluster = Config{Workers: 4, Capacity: 400, ChunkTokens: 512, Seed: 5, Engine: engine.Config{Shards: 2, JumpSize: 8}}

// comparable strips a result of what varies from run to run: timings and memory.
func comparable(r Result) Result {
	r.Seconds = 0
	r.Index.EngineSeconds = 0
	r.Index.FindMatchesP50, r.Index.FindMatchesP99, r.Index.FindMatchesP999 = 0, 0, 0
	r.Index.HeapBytes = 0
	return r
}

// untiered are the policies that differ without a host tier (kv-weighted and
// kv-any-tier are kv-aware then, TestHostTier checks).
func untiered() []Policy { return Policies()[:KVWeighted] }

func TestRunIsDeterministic(t *testing.T) {
	sequential(t)
	w := small(t, 800)
	for _, p := range append(untiered(), KVWeighted) {
		cfg := smallCluster
		w := w
		if p == KVWeighted {
			cfg.HostCapacity = 300
			w = w.Head(400)
		}
		t.Run(p.String(), func(t *testing.T) {
			a, err := Run(context.Background(), w, p, cfg)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Run(context.Background(), w, p, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(comparable(a), comparable(b)) {
				t.Fatalf("two runs differ:\n%+v\n%+v", comparable(a), comparable(b))
			}
			if a.Requests != len(w.Requests) || a.Blocks != w.Blocks || a.Tokens != w.Tokens {
				t.Fatalf("served %d requests, %d blocks, %d tokens", a.Requests, a.Blocks, a.Tokens)
			}
			if a.Index.RemovedEvents == 0 && p != Approximate {
				t.Fatal("no evictions: the test cluster is too large")
			}
			if p == Approximate && a.Index.StoredEvents+a.Index.RemovedEvents != 0 {
				t.Fatalf("approximate sent %d events to the index", a.Index.StoredEvents+a.Index.RemovedEvents)
			}
			if a.Index.Rejected != 0 || a.Index.Events != uint64(a.Index.StoredEvents+a.Index.RemovedEvents) ||
				(cfg.HostCapacity > 0) != (a.Index.HostStoredEvents > 0) {
				t.Fatalf("events: %+v", a.Index)
			}
			wantQueries := int64(0)
			if p.queries() {
				wantQueries = int64(len(w.Requests))
				for _, r := range w.Requests {
					if len(r.Blocks) == 0 {
						wantQueries--
					}
				}
			}
			if a.Index.Queries != wantQueries {
				t.Fatalf("%d queries, want %d", a.Index.Queries, wantQueries)
			}
		})
	}
}

func TestRunKVAwareWins(t *testing.T) {
	sequential(t)
	w := small(t, 1500)
	ceil := InfiniteCache(w)
	res := map[Policy]Result{}
	for _, p := range untiered() {
		r, err := Run(context.Background(), w, p, smallCluster)
		if err != nil {
			t.Fatal(err)
		}
		res[p] = r
		if r.BlockHitRate() > ceil.BlockHitRate() || r.TokenHitRate() > ceil.TokenHitRate() {
			t.Errorf("%v: hit rates %.4f/%.4f above the ceiling %.4f/%.4f", p, r.BlockHitRate(), r.TokenHitRate(), ceil.BlockHitRate(), ceil.TokenHitRate())
		}
		if m := r.MaxMeanLoad(); m < 1 || m > 1.25 {
			t.Errorf("%v: max/mean load %.3f", p, m)
		}
	}
	kv := res[KVAware].BlockHitRate()
	for _, p := range []Policy{Random, RoundRobin, LeastLoaded} {
		if o := res[p].BlockHitRate(); kv < o+0.15 {
			t.Errorf("kv-aware %.3f is not clearly above %v %.3f", kv, p, o)
		}
	}
	if m := res[KVAware].MaxMeanLoad(); m > 1.1+4.0/375 {
		t.Errorf("kv-aware max/mean load %.3f breaks the 1.1 bound", m)
	}
}

func TestRunMeasuresIndex(t *testing.T) {
	w := small(t, 600)
	var progressed int
	cfg := smallCluster
	cfg.MeasureMemory = true
	cfg.Progress = func(n int) { progressed += n }
	r, err := Run(context.Background(), w, KVAware, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if progressed != len(w.Requests) {
		t.Fatalf("progress reported %d of %d requests", progressed, len(w.Requests))
	}
	s := r.Index
	if s.BlockOps() != s.QueryBlocks+s.StoredBlocks+s.RemovedBlocks || s.QueryBlocks != w.Blocks || s.BlockOpsPerS() <= 0 {
		t.Fatalf("block ops: %+v", s)
	}
	if s.FindMatchesP50 <= 0 || s.FindMatchesP50 > s.FindMatchesP99 || s.FindMatchesP99 > s.FindMatchesP999 {
		t.Fatalf("latencies %d %d %d", s.FindMatchesP50, s.FindMatchesP99, s.FindMatchesP999)
	}
	if s.Memberships <= 0 || s.Memberships > 4*400 {
		t.Fatalf("memberships %d", s.Memberships)
	}
	if b := s.BytesPerMembership(); b <= 0 || b > 5000 {
		t.Fatalf("%.1f bytes per membership (heap %d)", b, s.HeapBytes)
	}
}

func TestRunRejects(t *testing.T) {
	w := small(t, 50)
	tests := []struct {
		name string
		cfg  Config
		p    Policy
		want string
	}{
		{"negative workers", Config{Workers: -1}, KVAware, "workers"},
		{"too many workers", Config{Workers: MaxWorkers + 1}, KVAware, "workers"},
		{"negative capacity", Config{Capacity: -5}, KVAware, "capacity"},
		{"capacity too large", Config{Capacity: MaxCapacity + 1}, KVAware, "capacity"},
		{"fleet too large", Config{Workers: MaxWorkers, Capacity: MaxCapacity}, KVAware, "in all"},
		{"capacity below the longest request", Config{Capacity: w.MaxBlocks - 1}, KVAware, "longest request"},
		{"negative chunk", Config{ChunkTokens: -1}, KVAware, "chunk"},
		{"bad engine config", Config{Engine: engine.Config{JumpSize: -1}}, KVAware, "JumpSize"},
		{"unknown policy", Config{}, Policy(9), "Policy(9)"},
		{"negative host capacity", Config{HostCapacity: -1}, KVAware, "host capacity"},
		{"host capacity too large", Config{HostCapacity: MaxCapacity + 1}, KVAware, "host capacity"},
		{"fleet with its hosts too large", Config{Workers: 4096, Capacity: 4096, HostCapacity: 16384}, KVAware, "host) blocks is more than"},
		{"negative host load cost", Config{HostLoadCost: -0.5}, KVAware, "host load cost"},
		{"host load cost above 1", Config{HostLoadCost: 1.5}, KVAware, "host load cost"},
		{"NaN host load cost", Config{HostLoadCost: math.NaN()}, KVAware, "host load cost"},
		{"tier weight above 1", Config{TierWeights: engine.Weights{1, 2, 0}}, KVWeighted, "weight of tier host"},
		{"NaN tier weight", Config{TierWeights: engine.Weights{math.NaN(), 0, 0}}, KVWeighted, "weight of tier device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), w, tc.p, tc.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRunStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := smallCluster
	n := 0
	cfg.Progress = func(k int) {
		if n += k; n >= 128 {
			cancel()
		}
	}
	_, err := Run(ctx, small(t, 1000), KVAware, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

// sequential skips a test of the simulation alone under the race detector in make test:
// package sim starts no goroutine (the engine's shards are the engine's tests' to race),
// so the detector adds nothing but a 5-10x slowdown there. make race runs package sim
// again without the detector, make test-long with it.
func sequential(t *testing.T) {
	t.Helper()
	if !testsize.Full() {
		t.Skip("sequential: make race runs it without the race detector, make test-long with it")
	}
}

// TestWriteOpsReplays checks the simulator's event stream against the reference model:
// the op log gen-ops writes, expectations included, replays through the engine with no
// failure, at several shard counts and jump sizes.
func TestWriteOpsReplays(t *testing.T) {
	sequential(t)
	w := small(t, 700)
	if testing.Short() {
		w = w.Head(300)
	}
	tests := []struct {
		policy Policy
		every  int
		engine engine.Config
		host   int // Config.HostCapacity
	}{
		{KVAware, 1, engine.Config{Shards: 1, JumpSize: 1}, 0},
		{KVAware, 3, engine.Config{Shards: 3, JumpSize: 4}, 0},
		{Random, 2, engine.Config{Shards: 2, JumpSize: 64}, 0},
		{RoundRobin, 2, engine.Config{Shards: 4, JumpSize: 3}, 0},
		{LeastLoaded, 2, engine.Config{Shards: 2, JumpSize: 8}, 0},
		// With a host tier the log carries host-tier stored and removed ops (offloads
		// and the host's evictions) and per-tier expectations: a small host evicts
		// often, a large one seldom.
		// (On the first 400 requests: with the host's events they cost twice as much.)
		{KVWeighted, 2, engine.Config{Shards: 2, JumpSize: 4}, 150},
		{RoundRobin, 2, engine.Config{Shards: 1, JumpSize: 2}, 1200},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v/every%d/shards%d/jump%d/host%d", tc.policy, tc.every, tc.engine.Shards, tc.engine.JumpSize, tc.host), func(t *testing.T) {
			var buf bytes.Buffer
			cfg := smallCluster
			cfg.HostCapacity = tc.host
			w := w
			if tc.host > 0 {
				w = w.Head(min(400, len(w.Requests)))
			}
			res, err := WriteOps(context.Background(), &buf, w, tc.policy, cfg, tc.every)
			if err != nil {
				t.Fatal(err)
			}
			ops, err := oplog.ReadAll(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) != res.Ops || res.Ops != res.Queries+res.Stored+res.Removed || res.Removed == 0 {
				t.Fatalf("%d ops read, result %+v", len(ops), res)
			}
			if res.Queries != res.Sim.Requests || res.Expectations != res.Queries/tc.every {
				t.Fatalf("queries: %+v", res)
			}
			got, err := replay.Run(context.Background(), ops, replay.Options{Config: tc.engine})
			if err != nil {
				t.Fatal(err)
			}
			if got.Failed != 0 || got.Passed != res.Expectations || got.Passed < 100 {
				t.Fatalf("replay: %d passed, %d failed: %v", got.Passed, got.Failed, got.Mismatches)
			}
			if got.Rejected != int(res.Sim.Index.Rejected) {
				t.Fatalf("replay rejected %d stores, the simulation %d", got.Rejected, res.Sim.Index.Rejected)
			}
			hostOps, tiered := 0, 0
			for i := range ops {
				if ops[i].Tier != 0 {
					hostOps++
				}
				if ops[i].Tiers != nil {
					tiered++
				}
			}
			s := res.Sim.Index
			if int64(hostOps) != s.HostStoredEvents+s.HostRemovedEvents || (tc.host > 0) != (hostOps > 0 && tiered > 0 && res.Sim.LoadedTokens > 0) {
				t.Fatalf("host %d: %d host-tier ops, %d queries with per-tier expectations, %d tokens loaded; %+v", tc.host, hostOps, tiered, res.Sim.LoadedTokens, s)
			}
		})
	}
}

func TestWriteOpsRejectsObserver(t *testing.T) {
	cfg := smallCluster
	cfg.Observer = &opRecorder{}
	if _, err := WriteOps(context.Background(), &bytes.Buffer{}, small(t, 10), KVAware, cfg, 1); !errors.Is(err, ErrConfig) {
		t.Fatalf("WriteOps = %v", err)
	}
}

// traceCluster is the cluster of shared/conformance/trace_conversation.jsonl.
// Its events reach the index at once (EventDelay < 0), as they did when it was made.
var traceCluster = Config{Workers: 8, Capacity: 4096, ChunkTokens: 8192, EventDelay: -1}

// TestTraceClusterMatchesConformanceLog runs the cluster that produced
// shared/conformance/trace_conversation.jsonl (8 engines x 4096 blocks of 64 tokens,
// kv-aware, the first 750 trace requests). Content and engine hashes differ (that log uses
// blake2b), but every count its README gives must come out exactly, and, when the log is
// present, the op stream must have the same shape line by line and the same answers.
func TestTraceClusterMatchesConformanceLog(t *testing.T) {
	sequential(t)
	w, err := FromTrace("conversation", conversationTrace(t, 750), 64)
	if err != nil {
		t.Fatal(err)
	}
	every := 5
	if testing.Short() {
		every = 25
	}
	var buf bytes.Buffer
	res, err := WriteOps(context.Background(), &buf, w, KVAware, traceCluster, every)
	if err != nil {
		t.Fatal(err)
	}
	r, s := res.Sim, res.Sim.Index
	counts := []struct {
		name      string
		got, want int64
	}{
		{"ops", int64(res.Ops), 117555},
		{"queries", int64(res.Queries), 750},
		{"stored events", s.StoredEvents, 1603},
		{"removed events", s.RemovedEvents, 115202},
		{"block ops", s.BlockOps(), 423855},
		{"query hashes", s.QueryBlocks, 160845},
		{"stored blocks", s.StoredBlocks, 147808},
		{"removed hashes", s.RemovedBlocks, 115202},
		{"memberships", s.Memberships, 32606},
		{"rejected", s.Rejected, 0},
	}
	for _, c := range counts {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	if got := math.Round(r.BlockHitRate()*1e4) / 1e4; got != 0.0811 {
		t.Errorf("realised prefix hit rate %.4f, want 0.0811", r.BlockHitRate())
	}
	if got := math.Round(r.MaxMeanLoad()*1e3) / 1e3; got != 1.003 {
		t.Errorf("max/mean load %.4f, want 1.003", r.MaxMeanLoad())
	}

	mine, err := oplog.ReadAll(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := replay.Run(context.Background(), mine, replay.Options{})
	if err != nil || got.Failed != 0 || got.Passed != 750/every {
		t.Fatalf("replay: %d passed, %d failed, %v: %v", got.Passed, got.Failed, err, got.Mismatches)
	}
	if testing.Short() {
		return
	}
	d := sharedDir(t, "conformance", "trace_conversation.jsonl")
	f, err := os.Open(filepath.Join(d, "trace_conversation.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := oplog.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(theirs) != len(mine) {
		t.Fatalf("%d ops, the conformance log has %d", len(mine), len(theirs))
	}
	for i := range mine {
		a, b := mine[i], theirs[i]
		if a.Kind != b.Kind || a.Worker != b.Worker || a.HasParent != b.HasParent ||
			len(a.Blocks) != len(b.Blocks) || len(a.Seqs) != len(b.Seqs) || len(a.Content) != len(b.Content) {
			t.Fatalf("line %d: %v %q parent=%v %d/%d/%d, the conformance log has %v %q parent=%v %d/%d/%d", i+1,
				a.Kind, a.Worker, a.HasParent, len(a.Blocks), len(a.Seqs), len(a.Content),
				b.Kind, b.Worker, b.HasParent, len(b.Blocks), len(b.Seqs), len(b.Content))
		}
		if a.HasExpect && (!reflect.DeepEqual(a.Expect, b.Expect) || !reflect.DeepEqual(a.Sizes, b.Sizes)) {
			t.Fatalf("line %d: answer %v %v, the conformance log has %v %v", i+1, a.Expect, a.Sizes, b.Expect, b.Sizes)
		}
	}
}

// TestHostTier checks the tiered runs' accounting, and that without a host tier the
// three kv-aware scorings are one policy: every tier's prefix is the device's.
func TestHostTier(t *testing.T) {
	sequential(t)
	w := small(t, 500)
	run := func(p Policy, host int) Result {
		t.Helper()
		cfg := smallCluster
		cfg.HostCapacity = host
		r, err := Run(context.Background(), w, p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return comparable(r)
	}
	kv := run(KVAware, 0)
	for _, p := range []Policy{KVWeighted, KVAnyTier} {
		r := run(p, 0)
		r.Policy = KVAware
		if !reflect.DeepEqual(r, kv) {
			t.Errorf("%v without a host tier differs from kv-aware:\n%+v\n%+v", p, r, kv)
		}
	}
	if kv.HostHitBlocks != 0 || kv.LoadedTokens != 0 || kv.Orphans != 0 || kv.Index.HostMemberships != 0 ||
		kv.PrefillTokens != float64(kv.Tokens-kv.ReusedTokens) {
		t.Fatalf("without a host tier: %+v", kv)
	}
	withHost := map[Policy]Result{}
	for _, p := range []Policy{KVAware, KVWeighted, KVAnyTier, RoundRobin} {
		r := run(p, 800)
		withHost[p] = r
		if r.HostHitBlocks == 0 || r.LoadedTokens == 0 || r.LoadedTokens > r.ReusedTokens || r.Index.HostMemberships == 0 ||
			r.Index.HostStoredEvents == 0 || r.Index.Rejected != 0 {
			t.Fatalf("%v with a host tier: %+v", p, r)
		}
		computed := float64(r.Tokens - r.ReusedTokens)
		if want := computed + DefaultHostLoadCost*float64(r.LoadedTokens); r.PrefillTokens != want {
			t.Fatalf("%v: prefill tokens %v, want %v", p, r.PrefillTokens, want)
		}
		if r.HostHitRate()+r.BlockHitRate() > InfiniteCache(w).BlockHitRate() {
			t.Fatalf("%v: device %.4f + host %.4f above the ceiling", p, r.BlockHitRate(), r.HostHitRate())
		}
	}
	// Device-only scoring sees the same device caches with a host tier: a loaded block
	// takes the device block its recomputation would have, so kv-aware routes as before.
	if kvh := withHost[KVAware]; !reflect.DeepEqual(kvh.Loads, kv.Loads) || kvh.HitBlocks != kv.HitBlocks {
		t.Fatalf("kv-aware with a host tier: loads %v, device hits %d; without: %v, %d", kvh.Loads, kvh.HitBlocks, kv.Loads, kv.HitBlocks)
	}
	// Round-robin routes the same with or without a host: the host can only add reuse.
	rr0, rr := run(RoundRobin, 0), withHost[RoundRobin]
	if !reflect.DeepEqual(rr.Loads, rr0.Loads) || rr.ReusedTokens <= rr0.ReusedTokens || rr.PrefillWork() >= rr0.PrefillWork() {
		t.Fatalf("round-robin: %d tokens reused with a host tier (work %.4f), %d without (%.4f)", rr.ReusedTokens, rr.PrefillWork(), rr0.ReusedTokens, rr0.PrefillWork())
	}
}
