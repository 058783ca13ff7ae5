package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
)

// A router's first use of the index: hash the request's tokens into per-block content
// hashes, record what each worker cached, and ask who holds the longest prefix. In a
// deployment the Store calls come from package subscriber, which follows each worker's
// KV-cache events; here they are written out.
func Example() {
	ctx := context.Background()
	e, err := engine.New(engine.Config{}) // zero values: every default
	if err != nil {
		panic(err)
	}
	defer e.Close()

	const blockSize = 4 // the inference engines' block size, in tokens
	prompt := []uint32{151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872}
	content, err := hash.Blocks(nil, prompt, blockSize) // 13 tokens: 3 full blocks
	if err != nil {
		panic(err)
	}

	// pod-a cached the first two blocks, pod-b only the first. Seq is the inference
	// engine's own hash of each block, which its later removals name.
	if err := e.Store("pod-a", []engine.Block{{Content: content[0], Seq: 0xa1}, {Content: content[1], Seq: 0xa2}}); err != nil {
		panic(err)
	}
	if err := e.Store("pod-b", []engine.Block{{Content: content[0], Seq: 0xb1}}); err != nil {
		panic(err)
	}

	// Events reach the shards asynchronously; a barrier makes every event applied so far
	// visible to the queries that follow (a router that can answer from a moment ago
	// skips it).
	if err := e.Barrier(ctx); err != nil {
		panic(err)
	}
	matches, err := e.FindMatches(ctx, content, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d blocks asked\n", len(content))
	for _, m := range matches {
		fmt.Printf("%s holds the first %d (%d cached in all)\n", m.Worker, m.Score, m.Size)
	}
	// Output:
	// 3 blocks asked
	// pod-a holds the first 2 (2 cached in all)
	// pod-b holds the first 1 (1 cached in all)
}

// An ingester applies a decoded event batch with one ApplyBatch call and gets one
// error per event. Namespaces keep models, LoRA adapters and cache salts apart:
// package subscriber applies events in subscriber.Namespace(model, ns), which is
// "model=" + model + ";" + ns, and a query must name the same namespace.
func ExampleEngine_ApplyBatch() {
	ctx := context.Background()
	e, err := engine.New(engine.Config{})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	content, _ := hash.Blocks(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4)
	const llama = "model=llama-3-8b;"
	batch := []engine.Event{
		{Kind: engine.EventStored, Worker: "pod-a", Namespace: llama,
			Blocks: []engine.Block{{Content: content[0], Seq: 0xa1}}},
		// A continuation names its parent, the engine hash of the block before it.
		{Kind: engine.EventStored, Worker: "pod-a", Namespace: llama, Parent: 0xa1, HasParent: true,
			Blocks: []engine.Block{{Content: content[1], Seq: 0xa2}}},
		// A parent the worker does not hold is rejected and changes nothing.
		{Kind: engine.EventStored, Worker: "pod-a", Namespace: llama, Parent: 0xdead, HasParent: true,
			Blocks: []engine.Block{{Content: content[1], Seq: 0xa3}}},
		// The same blocks under another model are another prefix tree.
		{Kind: engine.EventStored, Worker: "pod-b", Namespace: "model=mistral-7b;",
			Blocks: []engine.Block{{Content: content[0], Seq: 0xb1}}},
	}
	errs := e.ApplyBatch(batch, nil)
	for i, err := range errs {
		fmt.Printf("event %d: accepted=%v parent-not-found=%v\n", i, err == nil, errors.Is(err, engine.ErrParentNotFound))
	}

	_ = e.Barrier(ctx)
	for _, ns := range []string{llama, "model=mistral-7b;", ""} {
		matches, _ := e.FindMatchesIn(ctx, ns, content, nil)
		fmt.Printf("namespace %q: %v\n", ns, matches)
	}
	// Output:
	// event 0: accepted=true parent-not-found=false
	// event 1: accepted=true parent-not-found=false
	// event 2: accepted=false parent-not-found=true
	// event 3: accepted=true parent-not-found=false
	// namespace "model=llama-3-8b;": [{pod-a 2 2 0 [2 2 2]}]
	// namespace "model=mistral-7b;": [{pod-b 1 1 0 [1 1 1]}]
	// namespace "": []
}

// A snapshot carries the whole index across a restart: write it, restore it into a new
// engine (of any shard count) and the answers are the same. Each worker's Cursor (the
// position of the last event applied from its stream) comes back too, so an ingester
// knows where to resume.
func ExampleEngine_WriteSnapshot() {
	ctx := context.Background()
	e, err := engine.New(engine.Config{Shards: 2})
	if err != nil {
		panic(err)
	}
	content, _ := hash.Blocks(nil, []uint32{10, 11, 12, 13, 14, 15, 16, 17}, 4)
	_ = e.Apply(&engine.Event{Kind: engine.EventStored, Worker: "pod-a", Cursor: 41,
		Blocks: []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}})

	var snap bytes.Buffer
	if err := e.WriteSnapshot(&snap); err != nil {
		panic(err)
	}
	_ = e.Close()

	restored, err := engine.Restore(engine.Config{Shards: 4}, &snap, 64<<20) // bound what a file may make us read
	if err != nil {
		panic(err)
	}
	defer restored.Close()
	_ = restored.Barrier(ctx)
	matches, _ := restored.FindMatches(ctx, content, nil)
	fmt.Println(matches, restored.Cursors())

	// A damaged snapshot is refused as a whole.
	_, err = engine.RestoreBytes(engine.Config{}, []byte("not a snapshot"))
	fmt.Println(errors.Is(err, engine.ErrSnapshot))
	// Output:
	// [{pod-a 2 2 0 [2 2 2]}] map[pod-a:41]
	// true
}

// A client that sends rolling sequence hashes (Dynamo's and Mooncake Conductor's
// seq_hashes: hash.Prefixes of the content hashes) is answered by FindMatchesByPrefix
// on an engine that runs SPEC's chain, whose prefix hashes they are.
func ExampleEngine_FindMatchesByPrefix() {
	ctx := context.Background()
	e, err := engine.New(engine.Config{SpecChain: true})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	content := []uint64{0x11, 0x22, 0x33}
	if err := e.Store("pod-a", []engine.Block{{Content: 0x11, Seq: 1}, {Content: 0x22, Seq: 2}}); err != nil {
		panic(err)
	}
	if err := e.Barrier(ctx); err != nil {
		panic(err)
	}
	seqHashes := hash.Prefixes(nil, content) // what the client sends
	matches, err := e.FindMatchesByPrefix(ctx, seqHashes, nil)
	if err != nil {
		panic(err)
	}
	for _, m := range matches {
		fmt.Printf("%s holds the first %d\n", m.Worker, m.Score)
	}
	// On the default keyed chain the same query is refused.
	keyed, _ := engine.New(engine.Config{})
	defer keyed.Close()
	_, err = keyed.FindMatchesByPrefix(ctx, seqHashes, nil)
	fmt.Println(errors.Is(err, engine.ErrNotSpecChain))
	// Output:
	// pod-a holds the first 2
	// true
}
