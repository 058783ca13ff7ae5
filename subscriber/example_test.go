package subscriber_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/subscriber"
)

// Embedding the index in a Go router: one engine for the fleet, one Subscriber per
// inference engine (per data-parallel rank), each Run in its own goroutine. Queries
// name the namespace the subscribers apply events in, subscriber.Namespace(model, ns):
// with a model configured, a plain FindMatches (the "" namespace) finds nothing.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vllm := startFakeVLLM(ctx) // stands in for a vLLM engine started with --kv-events-config
	defer vllm.close()

	index, err := engine.New(engine.Config{})
	if err != nil {
		panic(err)
	}
	defer index.Close()
	sub, err := subscriber.New(subscriber.Config{
		Endpoint:       vllm.pubEndpoint,    // vLLM's "endpoint" (PUB), e.g. tcp://10.0.0.7:5557
		ReplayEndpoint: vllm.replayEndpoint, // its "replay_endpoint" (ROUTER), e.g. tcp://10.0.0.7:5558
		Worker:         "pod-7",
		Model:          "llama-3-8b",
		BlockSize:      4, // the engine's block size: only blocks cut like the router's queries match
		Index:          index,
	})
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = sub.Run(ctx) }() // reconnects and resyncs until ctx ends
	defer wg.Wait()
	defer cancel()

	// The subscriber syncs through the replay endpoint first, so it has the engine's
	// buffered batch even though it connected after the engine published it.
	for sub.Status().Batches == 0 {
		time.Sleep(10 * time.Millisecond)
	}

	prompt := []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 13, 1}
	content, _ := hash.Blocks(nil, prompt, 4)
	_ = index.Barrier(ctx) // make the applied events visible to the next query
	plain, _ := index.FindMatches(ctx, content, nil)
	matches, _ := index.FindMatchesIn(ctx, subscriber.Namespace("llama-3-8b", ""), content, nil)
	fmt.Println("default namespace:", plain)
	fmt.Println(subscriber.Namespace("llama-3-8b", "")+":", matches)
	st := sub.Status()
	fmt.Println(st.State, st.Synced, st.LastSeq)
	// Output:
	// default namespace: []
	// model=llama-3-8b;: [{pod-7 2 2}]
	// live true 0
}

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
