package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

// FuzzGRPCMatch feeds the Match handler whatever a peer can put in a message: any bytes
// that decode as a MatchRequest. It must answer or fail with InvalidArgument, never
// panic, and a valid answer must be well-formed.
func FuzzGRPCMatch(f *testing.F) {
	index, err := engine.New(engine.Config{Shards: 2})
	if err != nil {
		f.Fatal(err)
	}
	defer index.Close()
	s, err := New(Config{Models: map[string]int{"m": 4, "n": 1}, MaxQueryBlocks: 64}, Options{Index: index})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "w", Namespace: "model=m;",
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})
	// A host copy of both and a device eviction of the second: tiers [1 2 2].
	_ = index.Apply(&engine.Event{Kind: engine.EventCopied, Worker: "w", Tier: engine.TierHost, Seqs: []uint64{1, 2}})
	_ = index.Apply(&engine.Event{Kind: engine.EventRemoved, Worker: "w", Seqs: []uint64{2}})
	_ = index.Barrier(context.Background())
	svc := &grpcService{s: s}
	for _, req := range []*kvindexv1.MatchRequest{
		{Model: "m", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}},
		{Model: "m", ContentHashes: content, Policy: "random"},
		{Model: "n", Tokens: make([]uint32, 65), LoraName: "a;b", CacheSalt: "%"},
		{Tokens: []uint32{1}, Namespace: "lora=x", Policy: "round-robin"},
		{Model: "m", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, TierWeights: []float64{1, 0.5, 0.25}},
		{Model: "m", ContentHashes: content, TierWeights: []float64{0, 1}},
		{Model: "m", ContentHashes: content, TierWeights: []float64{1, 2, -1}},
	} {
		b, _ := proto.Marshal(req)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req kvindexv1.MatchRequest
		if proto.Unmarshal(b, &req) != nil {
			return // grpc-go refuses it before the handler
		}
		resp, err := svc.Match(context.Background(), &req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("%v: %v", &req, err)
			}
			return
		}
		if int(resp.Blocks) > 64 || len(resp.Matches) > 1 || (len(resp.Matches) == 1 && int(resp.Matches[0].Score) > int(resp.Blocks)) {
			t.Fatalf("%v: answer %v", &req, resp)
		}
		if len(resp.TierWeights) != engine.NumTiers {
			t.Fatalf("%v: weights %v", &req, resp.TierWeights)
		}
		for _, m := range resp.Matches {
			if len(m.Tiers) != engine.NumTiers || m.Tiers[0] > m.Tiers[1] || m.Tiers[1] > m.Tiers[2] || m.Tiers[2] != m.Score ||
				!(m.Weighted >= 0 && m.Weighted <= float64(m.Score)) {
				t.Fatalf("%v: match %v", &req, m)
			}
		}
	})
}
