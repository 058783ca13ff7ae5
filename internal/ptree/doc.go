// Package ptree is a persistent ordered map: an immutable B-tree whose changes copy
// only the nodes on the changed key's path (path copying), so that a new version costs
// O(log n) however many entries it holds, and every earlier version stays whole and
// readable. The server keeps its fleet of engines in such maps: handlers read the
// published version with no lock while an engine add or remove under the engines lock
// makes the next one, and an add no longer copies every map of the fleet.
//
// Who calls it: package server (its fleet, enginesinc.go). A Map or a Hashed is a
// value any number of goroutines may read at once; a Builder (HashedBuilder), which
// batches changes and copies each node once per batch, belongs to the goroutine using
// it until its Map is taken.
//
// Numbers behind the design. A node holds 7 to 15 entries (minimum degree 8) in fixed
// arrays, one allocation of 536 bytes for string keys and pointer values: a change
// copies one node per level (a delete also the sibling it borrows from or merges
// with), and 10,000 entries fit in 4 levels. Keys are compared with <, not hashed, so
// client-chosen keys (worker ids) cannot steer the tree's shape: its height is bounded
// by the entry count whatever the keys, and nothing needs a seed. Iteration is in key
// order, which the fleet's listings and per-model worker lists need.
//
// Measured on a shared 2-core machine (go test -run '^$' -bench . ./internal/ptree/):
// one entry set and deleted again costs 1.9 µs and 2 KB with 100 entries, 4.8 µs and
// 3 KB with 1,000, 14 µs and 5.6 KB with 10,000, against 10 µs / 7 KB, 82 µs / 109 KB
// and 2.2 ms / 874 KB for a Go map cloned per change. The price is the lookup: Get of a
// worker-like string among 10,000 takes 200-570 ns against 17-50 ns for a Go map (each
// comparison reads a key's bytes elsewhere in memory).
//
// Hashed is the same tree keyed by a seeded 64-bit hash of a string key (hash/maphash,
// a seed per map, made when the empty map is first edited), with the key and value in
// a bucket per hash: a lookup scans integers in the nodes and compares one key's bytes
// at the end, 150-285 ns in the same runs (BenchmarkHashedGet), about half of Map's.
// The fleet's maps looked up for every worker a query matches use it; the lists read in
// worker order (a model's workers) stay Maps. Hashed's order is the hashes', so
// listings sort.
package ptree
