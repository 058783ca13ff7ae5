// Package oplog reads and writes the JSON Lines op log: the language-neutral form of an
// event history (stored, removed, cleared, remove_worker) interleaved with queries that
// may carry their exact expected answer. Integers are full unsigned 64-bit values and are
// decoded as such, never through float64.
//
// A Reader is not safe for concurrent use; Write may be called from one goroutine at a
// time per writer.
package oplog
