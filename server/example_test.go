package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// The HTTP API in one program: a server over an index the caller fills (here by hand;
// normally its Engines entries make it follow vLLM/SGLang publishers itself), and a
// router's POST /v1/match. Routers in other languages send the token ids and let the
// server hash them; "content_hashes" sends hashes computed with package hash instead.
func Example() {
	index, err := engine.New(engine.Config{})
	if err != nil {
		panic(err)
	}
	defer index.Close() // the caller's: Shutdown leaves an Options.Index open
	ns := subscriber.Namespace("llama-3-8b", "")
	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4)
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-7", Namespace: ns,
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})
	// pod-9 holds the first block in device memory and the next two in host memory
	// (offloaded, as vLLM's medium "CPU" events say): its weighted score, 1 + 2 × 0.75,
	// beats pod-7's 2 device blocks.
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-9", Namespace: ns,
		Blocks: []engine.Block{{Content: content[0], Seq: 11}}})
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-9", Namespace: ns, Tier: engine.TierHost,
		Parent: 11, HasParent: true, Blocks: []engine.Block{{Content: content[1], Seq: 12}, {Content: content[2], Seq: 13}}})
	_ = index.Barrier(context.Background())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s, err := server.New(server.Config{Models: map[string]int{"llama-3-8b": 4}, Policy: server.PolicyLongestPrefix},
		server.Options{Index: index, Listener: ln})
	if err != nil {
		panic(err)
	}
	if err := s.Start(); err != nil {
		panic(err)
	}
	defer s.Shutdown(context.Background())

	resp, err := http.Post("http://"+s.Addr()+"/v1/match", "application/json",
		strings.NewReader(`{"model": "llama-3-8b", "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var pretty bytes.Buffer
	_ = json.Indent(&pretty, body, "", "  ")
	fmt.Println(resp.StatusCode)
	// A worker filled through Options.Index rather than a subscriber is "replicated".
	fmt.Println(pretty.String())
	// Output:
	// 200
	// {
	//   "model": "llama-3-8b",
	//   "namespace": "model=llama-3-8b;",
	//   "blocks": 3,
	//   "matches": [
	//     {
	//       "worker": "pod-9",
	//       "score": 3,
	//       "tiers": [
	//         1,
	//         3,
	//         3
	//       ],
	//       "weighted": 2.5,
	//       "size": 3,
	//       "predicted": 0,
	//       "state": "replicated",
	//       "trust": "exact"
	//     },
	//     {
	//       "worker": "pod-7",
	//       "score": 2,
	//       "tiers": [
	//         2,
	//         2,
	//         2
	//       ],
	//       "weighted": 2,
	//       "size": 2,
	//       "predicted": 0,
	//       "state": "replicated",
	//       "trust": "exact"
	//     }
	//   ],
	//   "matches_total": 2,
	//   "tier_weights": [
	//     1,
	//     0.75,
	//     0.25
	//   ],
	//   "pick": {
	//     "worker": "pod-9",
	//     "policy": "longest-prefix",
	//     "score": 3,
	//     "weighted": 2.5,
	//     "reason": "longest cached prefix"
	//   }
	// }
}
