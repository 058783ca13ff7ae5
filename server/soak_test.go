package server_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/server"
)

// TestServeSoak (make soak; KVINDEX_SOAK=3m) runs serve's API under the attacks of
// TestMemoryBudget, without pause, while real traffic goes on: a random event history
// applied to the index round after round, and its queries over HTTP, each answer
// compared with the reference model's. Goroutines, open files and RSS after each round
// stay within a margin of where they were after the first rounds.
func TestServeSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("KVINDEX_SOAK"))
	if err != nil {
		t.Skip("SKIP (set KVINDEX_SOAK=3m, or run make soak)")
	}
	index, err := engine.New(engine.Config{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	cfg := server.Config{Listen: "127.0.0.1:0", MaxBodyBytes: 1 << 20, MaxMatches: 64,
		Engines: []server.EngineConfig{{Worker: "w", Model: "m", BlockSize: 4}},
		GRPC:    server.GRPCConfig{Listen: "127.0.0.1:0", MaxMessageBytes: 1 << 20},
		Limits:  server.LimitsConfig{MaxConnections: 64, InFlightBytes: 8 << 20, ConnInFlightBytes: 2 << 20},
		Index:   server.IndexConfig{PredictedBlocks: 1 << 16, NamespaceBytes: 2 << 20}}
	s, err := server.New(cfg, server.Options{Index: index})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c := newClient(t, s.Addr())
	c.waitReady(t)
	stop := startAttack(t, s, c)
	defer func() { t.Logf("attack: %s", stop()) }()

	m := refmodel.New()
	r := rand.New(rand.NewPCG(23, 5))
	type sample struct {
		goroutines, fds int
		rssKB           int64
	}
	take := func() sample {
		debug.FreeOSMemory()
		fds, _ := os.ReadDir("/proc/self/fd")
		return sample{runtime.NumGoroutine(), len(fds), procKB(t, "VmRSS")}
	}
	var base sample
	start := time.Now()
	rounds, checked := 0, 0
	for ; rounds < 4 || time.Since(start) < d; rounds++ {
		var queries [][]uint64
		for _, op := range refmodel.RandomOps(r, 600, refmodel.RandomOptions{Workers: 4, MaxChain: 50}) {
			if op.Kind == oplog.Query {
				if len(op.Content) > 0 {
					queries = append(queries, op.Content)
				}
				continue
			}
			_ = m.Apply(&op)
			ev := replay.ModelEvent(&op, "m")
			_ = index.Apply(&ev)
		}
		if err := index.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, q := range queries {
			body, _ := json.Marshal(map[string]any{"model": "m", "content_hashes": q})
			var got server.MatchResponse
			// The attack keeps the in-flight budget full: a 503 is retried.
			for tries := 0; ; tries++ {
				code := c.do("POST", "/v1/match", string(body), &got)
				if code == 200 {
					break
				}
				if code != 503 || tries > 1000 {
					t.Fatalf("round %d: match %d", rounds, code)
				}
				time.Sleep(time.Millisecond) // back off as Retry-After asks, briefly
			}
			want := m.Query(q)
			n := min(len(want), cfg.MaxMatches)
			if got.MatchesTotal != len(want) || len(got.Matches) != n {
				t.Fatalf("round %d, query %v: %d of %d matches, want %d", rounds, q, len(got.Matches), got.MatchesTotal, len(want))
			}
			for i := range got.Matches {
				g, w := got.Matches[i], want[i]
				if g.Worker != w.Worker || g.Score != w.Score || g.Size != w.Size {
					t.Fatalf("round %d, query %v: %+v, want %+v", rounds, q, got.Matches, want)
				}
			}
			checked++
		}
		if rounds == 3 {
			base = take()
		}
	}
	end := take()
	t.Logf("%d rounds, %d queries checked in %v: goroutines %d -> %d, fds %d -> %d, RSS %d -> %d kB",
		rounds, checked, time.Since(start).Round(time.Second), base.goroutines, end.goroutines, base.fds, end.fds, base.rssKB, end.rssKB)
	if end.goroutines > base.goroutines+20 || end.fds > base.fds+20 || end.rssKB > base.rssKB*3/2+32<<10 {
		t.Errorf("resources grew: %+v -> %+v", base, end)
	}
}
