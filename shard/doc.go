// Package shard owns the positional index of one shard: a table from a key
// (namespace, position, prefix hash) to the set of workers that hold at least one block
// with that key.
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
// A flat, pointer-free, open-addressing table with linear probing in Robin Hood order
// and backward-shift deletion (no tombstones, so probe lengths do not rot under churn),
// sized by package internal/table: any size, growing by half at load 13/16. It is keyed
// by a key's fingerprint (Hash: the engine's seeded hash of the whole key; keys come
// from prompts, so where they land must not be known outside), and a slot is 12 bytes:
//
//	fingerprint (two uint32 words) | m uint32
//
// m is 0 for an empty slot, the worker id + 1 for a key with one member (inline), or
// names the key's overflow set (top bit set) once a second member arrives; an overflow
// key's member count is its set's length. The fingerprint is split in two words so that
// a slot needs no 8-byte alignment (one uint64 and a uint32 would pad to 16). In the
// traces this project is tuned for, almost every key is held by one worker, so the
// common case allocates nothing per entry and the garbage collector has nothing to
// scan. A slot carries its own hash, so moving it (growth, deletion, Robin Hood swaps)
// needs no rehash. Two keys share a slot only if their
// fingerprints collide; DESIGN.md ("Exactness of fingerprints") gives the argument. See
// table_bench_test.go for the built-in map and github.com/dolthub/swiss measured on the
// same key and value shape.
package shard
