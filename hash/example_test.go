package hash_test

import (
	"fmt"

	"github.com/kvindex/kvindex/hash"
)

// A router hashes each request once: Blocks cuts the token ids at the inference
// engines' block size (a trailing partial block is not cached, so it is dropped) and
// returns one content hash per full block, the values the index is queried with. The
// buffer is reused from request to request, so the hot path allocates nothing.
func ExampleBlocks() {
	var buf []uint64 // one per router goroutine
	// Two blocks of 4 and a partial one. Content([1 2 3 4]) = 0xcb38e4d7fb2dca5c is one of
	// the contract's test vectors (see the package documentation's algorithm).
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}

	content, err := hash.Blocks(buf[:0], prompt, 4)
	if err != nil {
		panic(err) // only a block size outside 1..MaxBlockSize fails
	}
	fmt.Println(len(content), "blocks")
	fmt.Printf("%#016x\n", content[0])
	fmt.Println(content[1] == hash.Content(prompt[4:8]))

	_, err = hash.Blocks(nil, prompt, 0)
	fmt.Println(err)
	// Output:
	// 2 blocks
	// 0xcb38e4d7fb2dca5c
	// true
	// hash: invalid block size: 0 (want 1..65536)
}

// Prefixes names each position's whole prefix: the first is the block's content hash,
// each next one chains the previous prefix with the block's content (Next). Two
// requests share a prefix hash at position i exactly when their first i+1 blocks are
// equal.
func ExamplePrefixes() {
	a, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4)
	b, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}, 4)
	pa, pb := hash.Prefixes(nil, a), hash.Prefixes(nil, b)
	for i := range pa {
		fmt.Printf("position %d: same prefix %v\n", i, pa[i] == pb[i])
	}
	fmt.Println(pa[0] == a[0], pa[1] == hash.Next(pa[0], a[1]))
	// Output:
	// position 0: same prefix true
	// position 1: same prefix true
	// position 2: same prefix false
	// true true
}
