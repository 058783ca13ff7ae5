// Command quickstart is the README's library quick start: it records what two workers
// cached and asks which one holds the longest prefix of a request. `make docs-check`
// checks that the README shows this file and its output.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

func main() {
	ctx := context.Background()
	index, err := engine.New(engine.Config{}) // zero values: every default
	if err != nil {
		log.Fatal(err)
	}
	defer index.Close()

	// A request's token ids, hashed per block of the engines' block size.
	const blockSize = 4
	prompt := []uint32{151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872}
	content, err := hash.Blocks(nil, prompt, blockSize) // 13 tokens: 3 full blocks
	if err != nil {
		log.Fatal(err)
	}

	// KV events, per worker, in its order (package subscriber makes these calls from
	// vLLM's and SGLang's streams). Seq is the engine's own hash of a block.
	if err := index.Store("pod-a", []engine.Block{{Content: content[0], Seq: 0xa1}, {Content: content[1], Seq: 0xa2}}); err != nil {
		log.Fatal(err)
	}
	if err := index.StoreUnder("pod-a", 0xa2, []engine.Block{{Content: content[2], Seq: 0xa3}}); err != nil {
		log.Fatal(err)
	}
	if err := index.Store("pod-b", []engine.Block{{Content: content[0], Seq: 0xb1}}); err != nil {
		log.Fatal(err)
	}
	if err := index.Remove("pod-a", 0xa3); err != nil { // pod-a evicted its third block
		log.Fatal(err)
	}

	// Events reach the shards asynchronously: a barrier makes those applied so far
	// visible to the next query (a router that may answer from a moment ago skips it).
	if err := index.Barrier(ctx); err != nil {
		log.Fatal(err)
	}
	matches, err := index.FindMatches(ctx, content, nil) // reuse the slice: no allocation
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d blocks asked\n", len(content))
	for _, m := range matches { // best first
		fmt.Printf("%s holds the first %d (%d cached in all)\n", m.Worker, m.Score, m.Size)
	}
}
