package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/kvindex/kvindex/api/kvindexv1"
	kvclient "github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// grpcFixture is a server over an index the test fills, serving HTTP on loopback and
// gRPC on an in-memory listener, and a gRPC client of it.
type grpcFixture struct {
	srv   *server.Server
	index *engine.Engine
	http  *client
	grpc  *kvclient.Client
	// raw calls the Index service directly, for requests the client cannot build
	// (a Routed with tokens, or with both tokens and content hashes).
	raw kvindexv1.IndexClient
}

func startGRPC(t *testing.T, cfg server.Config) *grpcFixture {
	t.Helper()
	index, err := engine.New(engine.Config{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { index.Close() })
	bl := bufconn.Listen(1 << 20)
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Models == nil && len(cfg.Engines) == 0 {
		cfg.Models = map[string]int{"m": 4, "other": 8}
	}
	s, err := server.New(cfg, server.Options{Index: index, GRPCListener: bl})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	dial := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bl.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	c, err := kvclient.Dial("passthrough:///bufconn", dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	conn, err := grpc.NewClient("passthrough:///bufconn", dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &grpcFixture{srv: s, index: index, http: newClient(t, s.Addr()), grpc: c, raw: kvindexv1.NewIndexClient(conn)}
}

// fill stores random chains of 4-token blocks for a few workers in model m's default
// namespace and returns token prompts that share prefixes with them.
func (f *grpcFixture) fill(t *testing.T, r *rand.Rand) [][]uint32 {
	t.Helper()
	ns := subscriber.Namespace("m", "")
	var prompts [][]uint32
	base := make([]uint32, 4*40)
	for i := range base {
		base[i] = uint32(r.IntN(50000))
	}
	seq := uint64(1)
	for w := 0; w < 5; w++ {
		n := 1 + r.IntN(30)
		content := must(hash.Blocks(nil, base[:4*n], 4))
		blocks := make([]engine.Block, n)
		for i := range blocks {
			blocks[i] = engine.Block{Content: content[i], Seq: seq}
			seq++
		}
		worker := fmt.Sprintf("w%d", w)
		if err := f.index.Apply(&engine.Event{Kind: engine.EventStored, Worker: worker, Namespace: ns, Blocks: blocks}); err != nil {
			t.Fatal(err)
		}
		// Offload some blocks to host memory or disk (copies by engine hash, as vLLM's
		// connector names them), then evict some from the device: the tiers differ.
		var toHost, toDisk, evict []uint64
		for _, b := range blocks {
			switch r.IntN(4) {
			case 0:
				toHost = append(toHost, b.Seq)
			case 1:
				toDisk = append(toDisk, b.Seq)
			}
			if r.IntN(3) == 0 {
				evict = append(evict, b.Seq)
			}
		}
		for _, ev := range []engine.Event{
			{Kind: engine.EventCopied, Worker: worker, Tier: engine.TierHost, Seqs: toHost},
			{Kind: engine.EventCopied, Worker: worker, Tier: engine.TierDisk, Seqs: toDisk},
			{Kind: engine.EventRemoved, Worker: worker, Seqs: evict},
		} {
			if err := f.index.Apply(&ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.index.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		p := append([]uint32(nil), base[:4*r.IntN(41)]...)
		if r.IntN(3) == 0 && len(p) > 8 {
			p[r.IntN(len(p))] = 1 << 30 // a divergence somewhere
		}
		prompts = append(prompts, append(p, 7, 7)) // and a partial block
	}
	return prompts
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestGRPCMatchEqualsHTTP: for random prompts, sent as tokens and as content hashes,
// the gRPC answer is the HTTP answer field for field (the pick included: the
// longest-prefix policy is deterministic).
func TestGRPCMatchEqualsHTTP(t *testing.T) {
	f := startGRPC(t, server.Config{TierWeights: []float64{1, 0.5, 0.125}, Policy: server.PolicyLongestPrefix}) // deterministic ties
	r := rand.New(rand.NewPCG(13, 1))
	ctx := context.Background()
	tiered := 0
	for i, p := range f.fill(t, r) {
		// The server's weights, and a request's own (every third prompt).
		var weights []float64
		if i%3 == 2 {
			weights = []float64{0.5, 1, 0}
		}
		var want server.MatchResponse
		body, _ := json.Marshal(map[string]any{"model": "m", "tokens": p, "tier_weights": weights})
		if code := f.http.do("POST", "/v1/match", string(body), &want); code != 200 {
			t.Fatalf("HTTP %d", code)
		}
		answers := []*kvindexv1.MatchResponse{must(f.grpc.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: p, TierWeights: weights}))}
		// An empty repeated field is no field in protobuf: a query of no full block can
		// only be sent as tokens.
		if content := must(hash.Blocks(nil, p, 4)); len(content) > 0 {
			answers = append(answers, must(f.grpc.Match(ctx, &kvindexv1.MatchRequest{Model: "m", ContentHashes: content, TierWeights: weights})))
		}
		if w := want.TierWeights; (weights == nil && w != engine.Weights{1, 0.5, 0.125}) || (weights != nil && w != engine.Weights{0.5, 1, 0}) {
			t.Fatalf("prompt %d: weights %v applied", i, w)
		}
		for _, got := range answers {
			if got.Model != want.Model || got.Namespace != want.Namespace || int(got.Blocks) != want.Blocks ||
				len(got.Matches) != len(want.Matches) || (got.Pick == nil) != (want.Pick == nil) ||
				fmt.Sprint(got.TierWeights) != fmt.Sprint(want.TierWeights[:]) {
				t.Fatalf("prompt %d: gRPC %v, HTTP %+v", i, got, want)
			}
			for j, m := range got.Matches {
				w := want.Matches[j]
				if m.Worker != w.Worker || int(m.Score) != w.Score || int(m.Size) != w.Size || m.State != w.State ||
					fmt.Sprint(m.Tiers) != fmt.Sprint(w.Tiers[:]) || m.Weighted != w.Weighted {
					t.Fatalf("prompt %d match %d: gRPC %v, HTTP %+v", i, j, m, w)
				}
				if w.Tiers[0] != w.Tiers[2] {
					tiered++
				}
			}
			if got.Pick != nil && (got.Pick.Worker != want.Pick.Worker || int(got.Pick.Score) != want.Pick.Score ||
				got.Pick.Policy != want.Pick.Policy || got.Pick.Reason != want.Pick.Reason || got.Pick.Weighted != want.Pick.Weighted) {
				t.Fatalf("prompt %d: pick %v, HTTP %+v", i, got.Pick, want.Pick)
			}
		}
		// The matches come best first, and the pick is the first pickable one.
		for j := 1; j < len(want.Matches); j++ {
			a, b := want.Matches[j-1], want.Matches[j]
			if a.Weighted < b.Weighted || (a.Weighted == b.Weighted && (a.Score < b.Score || (a.Score == b.Score && a.Worker > b.Worker))) {
				t.Fatalf("prompt %d: matches out of order: %+v", i, want.Matches)
			}
		}
		if len(want.Matches) > 0 && want.Pick.Weighted != want.Matches[0].Weighted {
			t.Fatalf("prompt %d: pick %+v is not the best weighted match of %+v", i, want.Pick, want.Matches)
		}
	}
	if tiered == 0 {
		t.Fatal("no match had blocks on a slower tier: the fixture does not exercise tiers")
	}
	// Another model's namespace holds nothing.
	resp := must(f.grpc.MatchTokens(ctx, "other", []uint32{1, 2, 3, 4, 5, 6, 7, 8}))
	if len(resp.Matches) != 0 || resp.Namespace != "model=other;" || resp.Blocks != 1 {
		t.Fatalf("other model: %v", resp)
	}
}

func TestGRPCRejectsBadQueries(t *testing.T) {
	f := startGRPC(t, server.Config{MaxQueryBlocks: 8})
	ctx := context.Background()
	for _, tc := range []struct {
		req  *kvindexv1.MatchRequest
		want string
	}{
		{&kvindexv1.MatchRequest{Tokens: []uint32{1, 2, 3, 4}}, "model is required"},
		{&kvindexv1.MatchRequest{Model: "nope", Tokens: []uint32{1}}, `unknown model "nope"`},
		{&kvindexv1.MatchRequest{Model: "m"}, "tokens or content_hashes is required"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, ContentHashes: []uint64{1}}, "not both"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, Policy: "best"}, `unknown policy "best"`},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, Namespace: "lora=a", LoraName: "a"}, "not both"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: make([]uint32, 4*9)}, "exceeds 8"},
		{&kvindexv1.MatchRequest{Model: "m", ContentHashes: make([]uint64, 9)}, "exceeds 8"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, TierWeights: []float64{1, 0.5}}, "tier_weights has 2 numbers"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, TierWeights: []float64{1, 0.5, 0, 0}}, "tier_weights has 4 numbers"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, TierWeights: []float64{1, 1.5, 0}}, "want a number in [0, 1]"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, TierWeights: []float64{math.NaN(), 0, 0}}, "want a number in [0, 1]"},
		{&kvindexv1.MatchRequest{Model: "m", Tokens: []uint32{1}, TierWeights: []float64{1, 0, math.Inf(-1)}}, "want a number in [0, 1]"},
	} {
		_, err := f.grpc.Match(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want InvalidArgument %q", tc.req, err, tc.want)
		}
	}
	// A query of exactly the limit is fine.
	if _, err := f.grpc.Match(ctx, &kvindexv1.MatchRequest{Model: "m", ContentHashes: make([]uint64, 8)}); err != nil {
		t.Fatal(err)
	}
}

// A peer of ours sends a message over the server's limit: it is refused before the
// server decodes it (RESOURCE_EXHAUSTED), and the connection and server keep working.
func TestGRPCBoundsMessageSize(t *testing.T) {
	f := startGRPC(t, server.Config{GRPC: server.GRPCConfig{MaxMessageBytes: 4096}})
	ctx := context.Background()
	_, err := f.grpc.MatchHashes(ctx, "m", make([]uint64, 1000)) // packed 1-byte varints: about 1 KB
	if err != nil {
		t.Fatalf("1000 zero hashes (about 1 KB) refused: %v", err)
	}
	big := make([]uint64, 1000)
	for i := range big {
		big[i] = ^uint64(i) // 10-byte varints: about 10 KB
	}
	_, err = f.grpc.MatchHashes(ctx, "m", big)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("10 KB message: %v, want ResourceExhausted", err)
	}
	if _, err := f.grpc.MatchHashes(ctx, "m", big[:10]); err != nil {
		t.Fatalf("after the refusal: %v", err)
	}
}

// A hostile peer of ours writes garbage to the gRPC port, and one opens an HTTP/2
// connection without ever sending its preface: neither stops the server answering.
func TestGRPCSurvivesGarbage(t *testing.T) {
	index, err := engine.New(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		GRPC: server.GRPCConfig{Listen: "127.0.0.1:0"}}, server.Options{Index: index})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	garbage, err := net.Dial("tcp", s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	junk := make([]byte, 1<<16)
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	_, _ = garbage.Write(junk) // the server may close before all of it is written
	garbage.Close()
	silent, err := net.Dial("tcp", s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	c, err := kvclient.Dial(s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.MatchTokens(context.Background(), "", []uint32{1, 2, 3, 4})
	if err != nil || resp.Blocks != 1 || resp.Model != "m" {
		t.Fatalf("%v, %v", resp, err)
	}
}

// Health: "" is liveness, kvindex.v1.Index readiness (false while an engine has not
// synced), any other service NOT_FOUND; Workers lists the followed ranks.
func TestGRPCHealthAndWorkers(t *testing.T) {
	f := startGRPC(t, server.Config{
		Engines: []server.EngineConfig{{Endpoint: freeport.Endpoint(t), Worker: "pod", Model: "m", BlockSize: 4, DPRanks: 2},
			{Worker: "quiet", Model: "m", BlockSize: 4}}, // no events: listed after, "approximate"
	})
	ctx := context.Background()
	if live, err := f.grpc.Live(ctx); err != nil || !live {
		t.Fatalf("live %v, %v", live, err)
	}
	if ready, err := f.grpc.Ready(ctx); err != nil || ready {
		t.Fatalf("ready %v, %v with engines never reached", ready, err)
	}
	ws, err := f.grpc.Workers(ctx)
	if err != nil || len(ws) != 3 || ws[0].Worker != "pod#dp0" || ws[1].DpRank != 1 || ws[0].Synced || ws[0].HasSeq ||
		ws[2].Worker != "quiet" || ws[2].State != "approximate" || ws[2].Model != "m" {
		t.Fatalf("workers %v, %v", ws, err)
	}
	var httpWorkers struct {
		Workers []server.WorkerInfo `json:"workers"`
	}
	f.http.do("GET", "/v1/workers", "", &httpWorkers)
	if len(httpWorkers.Workers) != 3 || httpWorkers.Workers[1].State != ws[1].State || httpWorkers.Workers[2].Worker != ws[2].Worker {
		t.Fatalf("HTTP workers %+v, gRPC %v", httpWorkers, ws)
	}
}

func TestGRPCConfigBounds(t *testing.T) {
	base := func(g server.GRPCConfig) server.Config {
		return server.Config{Models: map[string]int{"m": 4}, GRPC: g}
	}
	for _, tc := range []struct {
		g    server.GRPCConfig
		want string
	}{
		{server.GRPCConfig{Listen: "nope"}, "grpc.listen"},
		{server.GRPCConfig{MaxMessageBytes: 10}, "grpc.max_message_bytes"},
		{server.GRPCConfig{MaxMessageBytes: 1 << 30}, "grpc.max_message_bytes"},
		{server.GRPCConfig{MaxConcurrentStreams: 1 << 20}, "grpc.max_concurrent_streams"},
	} {
		if err := base(tc.g).Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.g, err, tc.want)
		}
	}
	if err := base(server.GRPCConfig{Listen: "127.0.0.1:9090", MaxMessageBytes: 1 << 20, MaxConcurrentStreams: 16}).Validate(); err != nil {
		t.Fatal(err)
	}
	cfg, err := server.ParseConfig(strings.NewReader(`{"models":{"m":4},"grpc":{"listen":"127.0.0.1:9090","max_concurrent_streams":8}}`))
	if err != nil || cfg.GRPC.Listen != "127.0.0.1:9090" || cfg.GRPC.MaxConcurrentStreams != 8 {
		t.Fatalf("%+v, %v", cfg.GRPC, err)
	}
}

// The limits a peer sees on the wire: the server's HTTP/2 SETTINGS announce the
// concurrent-stream and header-list bounds (grpc-go refuses streams beyond them).
func TestGRPCAnnouncesStreamBounds(t *testing.T) {
	index, err := engine.New(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		GRPC: server.GRPCConfig{Listen: "127.0.0.1:0", MaxConcurrentStreams: 3}}, server.Options{Index: index})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	conn, err := net.Dial("tcp", s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		streams, ok1 := sf.Value(http2.SettingMaxConcurrentStreams)
		headers, ok2 := sf.Value(http2.SettingMaxHeaderListSize)
		if !ok1 || streams != 3 || !ok2 || headers != 16<<10 {
			t.Fatalf("SETTINGS: max streams %d (%v), max header list %d (%v)", streams, ok1, headers, ok2)
		}
		return
	}
}

// gRPC calls are counted by method and code on /metrics, and timed by method.
func TestGRPCMetrics(t *testing.T) {
	f := startGRPC(t, server.Config{})
	ctx := context.Background()
	_, _ = f.grpc.MatchTokens(ctx, "m", []uint32{1, 2, 3, 4})
	_, _ = f.grpc.MatchTokens(ctx, "nope", []uint32{1})
	m := f.http.text("/metrics")
	for _, want := range []string{
		`kvindex_grpc_requests_total{code="OK",method="/kvindex.v1.Index/Match"} 1`,
		`kvindex_grpc_requests_total{code="InvalidArgument",method="/kvindex.v1.Index/Match"} 1`,
		`kvindex_grpc_request_duration_seconds_count{method="/kvindex.v1.Index/Match"} 2`,
		`kvindex_grpc_request_duration_seconds_bucket{method="/kvindex.v1.Index/Match",le="10"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestGRPCRouted records predictions over gRPC (Routed and Match's record) and reads
// them back over both APIs, for an index fed by another process (any worker name is
// the feeder's).
func TestGRPCRouted(t *testing.T) {
	f := startGRPC(t, server.Config{})
	ctx := context.Background()
	h, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	rr, err := f.grpc.Routed(ctx, "m", "pod-1", h, 30*time.Second)
	if err != nil || rr.GetBlocks() != 2 || rr.GetTtlMs() != 30000 || rr.GetNamespace() != "model=m;" {
		t.Fatalf("routed: %v %v", rr, err)
	}
	resp, err := f.grpc.Match(ctx, &kvindexv1.MatchRequest{Model: "m", ContentHashes: h[:1], Record: true})
	if err != nil || len(resp.GetMatches()) != 1 || resp.GetMatches()[0].GetPredicted() != 1 || !resp.GetRecorded() ||
		resp.GetPick().GetWorker() != "pod-1" {
		t.Fatalf("match: %v %v", resp, err)
	}
	var hr server.MatchResponse
	f.http.do("POST", "/v1/match", fmt.Sprintf(`{"model":"m","content_hashes":[%d,%d]}`, h[0], h[1]), &hr)
	if len(hr.Matches) != 1 || hr.Matches[0].Predicted != 2 || hr.Matches[0].Score != 2 {
		t.Fatalf("http match: %+v", hr)
	}
	for _, req := range []*kvindexv1.RoutedRequest{
		{Model: "m", ContentHashes: h},                                      // no worker
		{Model: "m", Worker: "w", ContentHashes: h, TtlMs: 600001},          // too long
		{Model: "m", Worker: "w"},                                           // no content
		{Model: "m", Worker: "w", ContentHashes: h, Tokens: []uint32{1, 2}}, // both
		{Model: "nope", Worker: "w", ContentHashes: h},                      // unknown model
		{Model: "m", Worker: "w", ContentHashes: h, Namespace: "bogus"},     // bad namespace
	} {
		if _, err := f.raw.Routed(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
	// Tokens are hashed at the model's block size, as content hashes are taken.
	rt, err := f.raw.Routed(ctx, &kvindexv1.RoutedRequest{Model: "m", Worker: "pod-2", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}})
	if err != nil || rt.GetBlocks() != 2 {
		t.Fatalf("routed tokens: %v %v", rt, err)
	}
	resp, err = f.grpc.MatchHashes(ctx, "m", h)
	if err != nil || len(resp.GetMatches()) != 2 {
		t.Fatalf("after routed tokens: %v %v", resp, err)
	}
}
