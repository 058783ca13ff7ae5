package radix_test

import (
	"fmt"

	"github.com/kvindex/kvindex/bench/radix"
	"github.com/kvindex/kvindex/engine"
)

func Example() {
	x := radix.New()
	_ = x.Store("a", []engine.Block{{Content: 1, Seq: 10}, {Content: 2, Seq: 11}, {Content: 3, Seq: 12}})
	_ = x.Store("b", []engine.Block{{Content: 1, Seq: 70}})
	_ = x.Remove("a", 11) // no cascade: 12 stays held, but the gap hides it
	fmt.Println(x.FindMatches([]uint64{1, 2, 3}, nil))
	_ = x.StoreUnder("a", 10, []engine.Block{{Content: 2, Seq: 13}}) // the refill reconnects 12
	fmt.Println(x.FindMatches([]uint64{1, 2, 3}, nil))
	// Output:
	// [{a 1 2 0 [1 1 1]} {b 1 1 0 [1 1 1]}]
	// [{a 3 3 0 [3 3 3]} {b 1 1 0 [1 1 1]}]
}
