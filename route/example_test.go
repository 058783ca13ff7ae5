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
		{Overlap: 60, ActiveOverlap: 60, Load: route.Load{ActiveBlocks: 900}},
		{Overlap: 0, Load: route.Load{ActiveBlocks: 100}},
		{Overlap: 32, Load: route.Load{ActiveBlocks: 200}},
	}
	costs := route.Cost{}.Costs(req, cands, nil)
	fmt.Println(costs, route.Cost{}.Pick(req, cands, 0))
	// Output: [908 228 296] 1
}

// Tracker keeps the load a router knows from its own requests, each distinct block
// counted once; the policies read it through Candidate.Load (Tracker.Candidates).
func ExampleTracker() {
	tr, err := route.NewTracker[string](route.TrackerConfig{})
	if err != nil {
		panic(err)
	}
	// Two requests of one conversation: the second repeats the first's 10 blocks.
	first := route.Request{Tokens: 640, BlockSize: 64, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
	second := route.Request{Tokens: 1000, BlockSize: 64, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}
	_ = tr.Routed("req-1", "http://10.0.0.1:8000", first, 0)
	_ = tr.Routed("req-2", "http://10.0.0.1:8000", second, 640)
	tr.FirstToken("req-1")
	fmt.Printf("%+v\n", tr.Load("http://10.0.0.1:8000"))
	tr.Finished("req-1")
	tr.Finished("req-2")
	fmt.Printf("%+v\n", tr.Load("http://10.0.0.1:8000"))
	// Output:
	// {Requests:2 Tokens:1640 UncachedTokens:1000 PrefillTokens:360 Prefilling:1 ActiveBlocks:15 Waiting:1 KVUtil:0}
	// {Requests:0 Tokens:0 UncachedTokens:0 PrefillTokens:0 Prefilling:0 ActiveBlocks:0 Waiting:0 KVUtil:0}
}
