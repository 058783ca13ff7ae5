// Package hash owns the two hash functions every kvindex component must agree on.
//
// # First use
//
// A router calls Blocks(buf[:0], tokens, blockSize) on each request, with the block size
// its inference engines use, and queries the index (package engine) with the content
// hashes it returns; it never needs the rest. Subscribers compute the same hashes from
// the engines' events, which is why both sides must use this package (see ExampleBlocks).
//
// # The two functions
//
//   - the content hash of one block of token ids: XXH3-64 with seed 1337 over the ids,
//     each written as 4 bytes little-endian (the value NVIDIA Dynamo calls LocalBlockHash
//     and the SGLang gateway calls ContentHash);
//   - the rolling prefix hash that names "the blocks from position 0 up to here":
//     the root is the content hash itself, and each deeper block chains
//     Next(prev, c) = XXH3-64(LE64(prev) ++ LE64(c), seed 1337).
//
// A block whose engine hash also covers inputs other than its tokens (vLLM's extra keys:
// multimodal identifiers, a cache salt, prompt-embedding digests) has the content hash
// ContentExtra(tokens, key) = XXH3-64(LE64(Content(tokens)) ++ key, seed 1337), key being
// the canonical CBOR of those inputs (package kvevents for events, package server for
// requests; vectors in testdata/vllmhash/vectors.json). So two prompts with the same
// image placeholder tokens but other images never share a content hash.
//
// All are pure functions: any goroutine may call them concurrently. The functions that
// fill a caller's buffer (Blocks, Prefixes) never allocate when the buffer is large
// enough, so a router can hash every request on its hot path.
//
// Why the root is the raw content value: an index keyed by (position, prefix hash)
// compares a root's content value only with other roots' content values, and a deeper
// prefix hash only with prefix hashes at the same depth. Answers are then exact up to
// 64-bit collisions of XXH3 and of nothing else.
//
// The prefix chain is SPEC's. Package engine no longer probes its index with it by
// default: it names positions by a keyed chain of its own whose steps a CPU computes in
// parallel (about 0.9 ns a block against Next's 4: go test -run '^$' -bench
// BenchmarkChain ./engine/; engine.Config.SpecChain restores Next). Routers and
// subscribers never see either: they exchange content hashes.
package hash
