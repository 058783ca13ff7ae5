// Package radix is the classic prefix-cache index, kept as a benchmark baseline: a radix
// tree over content hashes guarded by one sync.Mutex, the design of llm-d's KV-cache
// indexer and NVIDIA Dynamo's KvIndexer.
//
// It answers exactly what the engine answers (docs/semantics.md; the
// differential tests check it against internal/refmodel and every conformance log), so
// benchmarks compare designs, never semantics.
//
// # Design
//
//	root ─ c0 ─ c1 ─ c2        a node is (parent node, content hash); its path from
//	        │    └── c7        the root is the block's prefix, so "same prefix" is
//	        └─ c5 ─ c6         "same node", with no rolling hash and no positions
//
//	node:   children map[content]*node, holders [(worker, count)]
//	worker: seqs map[seq]*node (what it holds), size = len(seqs)
//
// A stored event walks (and creates) the path under its parent's node and adds one to
// the worker's count at each node it lands on; a held seq stored elsewhere moves (last
// write wins), and the same node again is a no-op. A removal subtracts one. Because a
// node's identity is its content path, removal never cascades and a refill of the same
// prefix lands on the same node, reconnecting the blocks below it without any
// bookkeeping. A node with no holders and no children is freed at once, and its parent
// is re-checked, so the tree only ever holds paths that lead to a held block: memory is
// bounded by the held blocks and their ancestors.
//
// A query walks from the root along its content. Every worker holding the first node is a
// candidate; at each next depth d, a candidate not among the next node's holders leaves
// with score d, and the walk stops where the path, or the candidates, run out. The cost
// is one map lookup and one pass over the holders per matched depth.
//
// # Concurrency
//
// Every method takes the one mutex for its whole duration: events serialise against each
// other and against queries. That is the point of the baseline: it is what the sharded
// engine's ownership design has to beat. An event whose call has returned is visible to
// every query that starts after it.
//
// # Costs the engine avoids
//
// Each node is a separate heap object with a map and a slice, so the tree is
// pointer-heavy (every GC cycle scans it) and costs a few hundred bytes per node; holder
// lists are scanned linearly, which is fastest for the few workers a real prefix has and
// slow for a prefix shared by thousands.
package radix
