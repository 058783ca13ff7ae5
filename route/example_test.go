package route_test

import (
	"fmt"

	"github.com/kvindex/kvindex/route"
)

// A router with three workers: the first holds most of the request's prefix but is
// busy decoding; Cost weighs the prefill it saves against the decode load it adds.
func ExampleCost() {
	req := route.Request{Tokens: 4096, BlockSize: 64} // 64 blocks
	cands := []route.Candidate{
		{Overlap: 60, Load: route.Load{ActiveBlocks: 900}},
		{Overlap: 0, Load: route.Load{ActiveBlocks: 100}},
		{Overlap: 32, Load: route.Load{ActiveBlocks: 200}},
	}
	costs := route.Cost{}.Costs(req, cands, nil)
	fmt.Println(costs, route.Cost{}.Pick(req, cands, 0))
	// Output: [968 228 296] 1
}

// Tracker keeps the load a router knows from its own requests; Scorer and Cost read it
// through Candidate.Load.
func ExampleTracker() {
	tr, err := route.NewTracker[string](route.TrackerConfig{})
	if err != nil {
		panic(err)
	}
	_ = tr.Routed("req-1", "http://10.0.0.1:8000", 1000, 640, 64)
	_ = tr.Routed("req-2", "http://10.0.0.1:8000", 300, 0, 64)
	tr.FirstToken("req-1")
	fmt.Printf("%+v\n", tr.Load("http://10.0.0.1:8000"))
	tr.Finished("req-1")
	tr.Finished("req-2")
	fmt.Printf("%+v\n", tr.Load("http://10.0.0.1:8000"))
	// Output:
	// {Requests:2 Tokens:1300 PrefillTokens:300 ActiveBlocks:21 Waiting:0 KVUtil:0}
	// {Requests:0 Tokens:0 PrefillTokens:0 ActiveBlocks:0 Waiting:0 KVUtil:0}
}
