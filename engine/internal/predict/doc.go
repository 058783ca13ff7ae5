// Package predict is the engine's prediction table: a router's word that a worker is
// about to hold a request's blocks (engine.Predict), kept until it expires or the
// worker's events cover or contradict it. The semantics are the engine's (package
// engine, predict.go, and DESIGN.md "Predictions"); this package is the table.
//
// # Ownership
//
// One owner, in every mode (sharded or locked): the holder of the table's mutex. Its
// write side (Lock) is held by Predict and by the events of workers with predictions,
// always after the worker's own mutex, never before; its read side (RLock) by queries
// (AppendHits) and by a look whether a worker has predictions (Has). Every method but
// Live says which side it needs; Live is an atomic load any goroutine may make (0 lets
// queries and events skip the table). The table starts no goroutine and no timer: an
// expired entry is skipped by readers and freed by the next Insert (oldest first), by
// Sweep or by the bounds.
//
// # Structure
//
// Entries live in a slab linked into three intrusive lists: the engine's insertion
// order, the worker's insertion order, and, per worker, the entries that share a query's
// first key, found through a map keyed by that key's seeded fingerprint and sorted by
// content, so that a query's longest common prefix with a worker's predictions costs a
// binary search per worker (its nearest live neighbours decide it) instead of a compare
// per entry.
package predict
