package subscriber_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/subscriber"
)

// Embedding the index in a Go router: followAndMatch (docs/library.md's "Embedding in a Go
// router" shows the same function) follows a stand-in vLLM engine and answers a
// request's prefix query.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vllm := startFakeVLLM(ctx) // has stored two 4-token blocks under the model's namespace
	defer vllm.close()

	prompt := []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 13, 1}
	matches, err := followAndMatch(ctx, vllm.pubEndpoint, vllm.replayEndpoint, prompt)
	fmt.Println(matches, err)
	// Output:
	// [{pod-7 2 2 0 [2 2 2]}] <nil>
}

// README:begin followAndMatch
// followAndMatch follows one vLLM engine's KV events and asks which worker holds the
// longest cached prefix of one request. A router keeps index and subscribers for its
// lifetime and queries on every request.
func followAndMatch(ctx context.Context, endpoint, replayEndpoint string, tokenIDs []uint32) ([]engine.Match, error) {
	// One index for the whole fleet.
	index, err := engine.New(engine.Config{}) // zero values: defaults
	if err != nil {
		return nil, err
	}
	defer index.Close()

	// One subscriber per engine and data-parallel rank, each Run in its own goroutine.
	const model, blockSize = "llama-3-8b", 4 // blockSize: the engine's --block-size
	sub, err := subscriber.New(subscriber.Config{
		Endpoint:       endpoint,       // vLLM's --kv-events-config "endpoint" (PUB), tcp://HOST:5557
		ReplayEndpoint: replayEndpoint, // its "replay_endpoint" (ROUTER): gaps and restarts recover
		Worker:         "pod-7",        // the id matches name; route requests by it
		Model:          model,
		BlockSize:      blockSize,
		Index:          index,
	})
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = sub.Run(ctx) }() // reconnects and resyncs until ctx ends
	defer wg.Wait()
	defer stop()

	// Route on a worker once its subscriber has synced (kvindex serve's /readyz waits
	// the same way); until then its matches may be short. Wait returns at once when it
	// is (sub.Synced says so without waiting).
	if err := sub.Wait(ctx); err != nil {
		return nil, err
	}
	// Events reach the index's shards asynchronously: a barrier makes every event applied
	// so far visible to the next query. A router that may answer from a moment ago skips it.
	if err := index.Barrier(ctx); err != nil {
		return nil, err
	}

	// Per request: content hashes at the engines' block size, then the query, in the
	// namespace the subscriber applies this model's events in ("model=llama-3-8b;").
	// A plain FindMatches asks the "" namespace, which holds nothing when a model is set.
	content, err := hash.Blocks(nil, tokenIDs, blockSize) // reuse the buffers on a hot path
	if err != nil {
		return nil, err
	}
	return index.FindMatchesIn(ctx, subscriber.Namespace(model, ""), content, nil)
}

// README:end followAndMatch

// Picking a worker: the index says how much of the prompt each worker holds, the
// router weighs that against their load (package route: Dynamo's cost here).
func Example_pickWorker() {
	workers := []string{"pod-7", "pod-9"}                  // every worker the router may route to
	matches := []engine.Match{{Worker: "pod-7", Score: 2}} // FindMatchesIn's answer: pod-9 holds nothing
	const promptTokens, blockSize = 12, 4

	idle := map[string]route.Load{}
	w, _ := pickWorker(workers, matches, idle, promptTokens, blockSize)
	fmt.Println("idle fleet:", w)
	busy := map[string]route.Load{"pod-7": {Requests: 3, PrefillTokens: 400, ActiveBlocks: 300}}
	w, _ = pickWorker(workers, matches, busy, promptTokens, blockSize)
	fmt.Println("pod-7 busy:", w)
	// Output:
	// idle fleet: pod-7
	// pod-7 busy: pod-9
}

// README:begin pickWorker
// candidates turns a query's matches into what a route.Policy picks from: every worker
// the router may send the request to, each with the blocks it holds (0 for a worker the
// query did not match: FindMatchesIn lists only workers holding a prefix, and an idle
// worker holding nothing is often the best pick) and the load the router knows of it.
func candidates(workers []string, matches []engine.Match, loads map[string]route.Load) []route.Candidate {
	overlap := make(map[string]int, len(matches))
	for _, m := range matches {
		overlap[m.Worker] = m.Score
	}
	out := make([]route.Candidate, len(workers))
	for i, w := range workers {
		out[i] = route.Candidate{Overlap: overlap[w], Load: loads[w]}
	}
	return out
}

// pickWorker picks with Dynamo's cost: prefill blocks left after the cache hit, weighed
// against the blocks each worker already decodes. A router makes the policy once.
func pickWorker(workers []string, matches []engine.Match, loads map[string]route.Load, promptTokens, blockSize int) (string, error) {
	cost, err := route.NewCost(route.DefaultOverlapWeight, 0) // weight, temperature
	if err != nil {
		return "", err
	}
	req := route.Request{Tokens: promptTokens, BlockSize: blockSize}
	k := cost.Pick(req, candidates(workers, matches, loads), rand.Uint64()) // rand: ties
	if k < 0 {
		return "", errors.New("no worker to route to")
	}
	return workers[k], nil
}

// README:end pickWorker

// fakeVLLM speaks the two sockets of vLLM's KV-event publisher (the package
// documentation has the format): PUB frames [topic, seq, payload], and a ROUTER that
// answers [b"", start_seq] with every buffered batch from start_seq and an end marker.
type fakeVLLM struct {
	pub, router                 zmq4.Socket
	pubEndpoint, replayEndpoint string
	done                        chan struct{}
}

// batch0 is one EventBatch: BlockStored of two 4-token blocks at the root of the
// prefix tree (package kvevents' golden vector A1 with its parent hash set to nil).
const batch0 = "93cb41da13b8601000009198ab426c6f636b53746f72656492cf8899aabbccddeeffcf0102030405060708" +
	"c098ce0002505ccd0368ccc6cd2368cd0176cd0117cd1a42cd013b04c0a3475055c000"

func startFakeVLLM(ctx context.Context) *fakeVLLM {
	v := &fakeVLLM{pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx), done: make(chan struct{})}
	if err := v.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		panic(err)
	}
	if err := v.router.Listen("tcp://127.0.0.1:0"); err != nil {
		panic(err)
	}
	v.pubEndpoint, v.replayEndpoint = "tcp://"+v.pub.Addr().String(), "tcp://"+v.router.Addr().String()
	payload, _ := hex.DecodeString(batch0)
	go func() {
		defer close(v.done)
		for {
			req, err := v.router.Recv() // [identity, b"", start_seq]
			if err != nil {
				return // closed
			}
			if len(req.Frames) != 3 || len(req.Frames[2]) != 8 {
				continue
			}
			id := req.Frames[0]
			if binary.BigEndian.Uint64(req.Frames[2]) == 0 {
				_ = v.router.Send(zmq4.NewMsgFrom(id, nil, make([]byte, 8), payload))
			}
			end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
			_ = v.router.Send(zmq4.NewMsgFrom(id, nil, end, nil))
		}
	}()
	return v
}

func (v *fakeVLLM) close() {
	v.pub.Close()
	v.router.Close()
	<-v.done
}
