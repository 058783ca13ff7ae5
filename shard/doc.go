// Package shard owns the positional index of one shard: a table from a key
// (position, prefix hash) to the set of workers that hold at least one block with that key.
//
// # Ownership
//
// An Index is owned by exactly one goroutine, the shard's run loop in package engine.
// It has no locks and no atomics; nothing else may touch it. Callers elsewhere learn
// what it holds only through messages answered by that goroutine.
//
// # What it stores, and what it does not
//
// The index stores membership, not multiplicity: a worker that covers one prefix through
// three engine hashes is one member. The engine's per-worker state counts engine hashes
// per key and sends Add only on a key's 0 -> 1 transition for that worker and Remove only
// on 1 -> 0, so the index never sees duplicates. Add and Remove still report whether they
// changed anything, so the engine can assert that invariant in tests.
//
// # Layout
//
// A flat, pointer-free, open-addressing table with linear probing and backward-shift
// deletion (no tombstones, so probe lengths do not rot under churn). Each slot is 32 bytes:
//
//	prefix uint64 | namespace uint32, pos uint32 | n uint32 | m [3]uint32
//
// Up to three members live inline in the slot (worker ids are small integers interned by
// the engine); a fourth moves the set into an overflow slab, and m[0] then names the slab
// entry. In the traces this project is tuned for, most keys are held by one to three
// workers, so the common case allocates nothing per entry and the garbage collector has
// nothing to scan. The table is the one seam where the hash table is chosen; see
// table_bench_test.go for the built-in map and github.com/dolthub/swiss measured on the
// same key and value shape, and DESIGN.md for the numbers that chose this table.
package shard
