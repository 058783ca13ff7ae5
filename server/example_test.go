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
	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	_ = index.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-7", Namespace: ns,
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})
	_ = index.Barrier(context.Background())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s, err := server.New(server.Config{Models: map[string]int{"llama-3-8b": 4}},
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
	//       "worker": "pod-7",
	//       "score": 2,
	//       "size": 2,
	//       "predicted": 0,
	//       "state": "replicated"
	//     }
	//   ],
	//   "pick": {
	//     "worker": "pod-7",
	//     "policy": "longest-prefix",
	//     "score": 2,
	//     "reason": "longest cached prefix"
	//   }
	// }
}
