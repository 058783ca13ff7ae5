package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer serves an index holding pod-7's first two blocks of the prompt 1..8 (block
// size 4, model "llama-3-8b") over gRPC on loopback.
func startServer() (addr string, stop func()) {
	index, err := engine.New(engine.Config{})
	if err != nil {
		panic(err)
	}
	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-7", Namespace: subscriber.Namespace("llama-3-8b", ""),
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})
	_ = index.Barrier(context.Background())
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"llama-3-8b": 4},
		GRPC: server.GRPCConfig{Listen: "127.0.0.1:0"}}, server.Options{Index: index})
	if err != nil {
		panic(err)
	}
	if err := s.Start(); err != nil {
		panic(err)
	}
	return s.GRPCAddr(), func() { _ = s.Shutdown(context.Background()); index.Close() }
}

// A router asks a kvindex serve --grpc which worker to send a request to.
func Example() {
	addr, stop := startServer() // kvindex serve --grpc 127.0.0.1:9090 ...
	defer stop()

	c, err := client.Dial(addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()
	resp, err := c.MatchTokens(ctx, "llama-3-8b", []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.GetPick().GetWorker(), resp.GetPick().GetScore(), "of", resp.GetBlocks(), "blocks cached")
	for _, m := range resp.GetMatches() {
		fmt.Println(m.GetWorker(), m.GetScore(), m.GetState())
	}
	live, _ := c.Live(ctx)
	ready, _ := c.Ready(ctx)
	fmt.Println("live", live, "ready", ready)
	// Output:
	// pod-7 2 of 3 blocks cached
	// pod-7 2 replicated
	// live true ready true
}

// dialServer starts startServer's server and a client of it, both stopped when the
// test ends.
func dialServer(t *testing.T) *client.Client {
	t.Helper()
	addr, stop := startServer()
	t.Cleanup(stop)
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClientErrors(t *testing.T) {
	c := dialServer(t)
	ctx := context.Background()
	if _, err := c.MatchHashes(ctx, "no-such-model", []uint64{1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown model: %v", err)
	}
	resp, err := c.MatchHashes(ctx, "", must(hash.Blocks(nil, []uint32{1, 2, 3, 4}, 4)))
	if err != nil || len(resp.GetMatches()) != 1 || resp.GetModel() != "llama-3-8b" {
		t.Fatalf("%v, %v", resp, err)
	}
	// A ttl past uint32 milliseconds is refused, not wrapped to 0 (the server's default).
	content := must(hash.Blocks(nil, []uint32{1, 2, 3, 4}, 4))
	if _, err := c.Routed(ctx, "", "pod-7", content, time.Duration(1<<32)*time.Millisecond); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ttl of 2^32 ms: %v", err)
	}
	if _, err := c.Routed(ctx, "", "pod-7", content, 0); err != nil {
		t.Fatalf("default ttl: %v", err)
	}
	ws, err := c.Workers(ctx) // fed through Options.Index: no subscribers to list
	if err != nil || len(ws) != 0 {
		t.Fatalf("%v, %v", ws, err)
	}
	// New on a caller's connection: Close leaves it alone.
	if err := client.New(nil).Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFinished: a request picked with an id is tracked until Finished says it is done;
// its first token ends its prefill but keeps it tracked, a second Finished does not
// know it, and an empty id is an invalid argument.
func TestFinished(t *testing.T) {
	c := dialServer(t)
	ctx := context.Background()
	// 12 tokens, 8 cached on pod-7: 4 to prefill.
	if _, err := c.Match(ctx, &kvindexv1.MatchRequest{Model: "llama-3-8b", Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, Pick: true, RequestId: "req-1"}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ first, known bool }{{true, true}, {false, true}, {false, false}} {
		known, err := c.Finished(ctx, "req-1", want.first)
		if err != nil || known != want.known {
			t.Errorf("call %d (first token %v): known %v, %v; want %v", i, want.first, known, err, want.known)
		}
	}
	if _, err := c.Finished(ctx, "", false); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty id: %v, want InvalidArgument", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestServiceName: the readiness service the client asks about is the one the server
// answers for, the Index service of the generated code (two hand-written constants
// could drift apart and Ready would report NotFound).
func TestServiceName(t *testing.T) {
	want := kvindexv1.Index_ServiceDesc.ServiceName
	for name, got := range map[string]string{"client.ServiceName": client.ServiceName, "server.GRPCServiceName": server.GRPCServiceName} {
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}
