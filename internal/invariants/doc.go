// Package invariants says whether this build checks kvindex's internal invariants: built
// with -tags invariants, Enabled is true and the engine, its shards and its tables verify
// their structure after every mutation (Robin Hood order and counts in every open-addressing
// table, each worker's holes and key counts recounted from its records, every held key's
// parent present, the seq counts summing to the table's size) and that each owner-only
// method runs on its owner, panicking with what broke. Without the tag Enabled is the
// constant false and every check compiles away.
//
// The model is pebble's internal/invariants (on.go / off.go) and the Go runtime's
// internal/runtime/maps table_debug.go (checkInvariants per table). make test runs the
// engine's and the shards' race tests once with the tag.
//
// Owner is the owner check: the holder of some owner-only state (a worker's mutex, a
// shard's table token) records itself with Acquire, and each owner-only method calls
// Check, which panics on any other goroutine (the goroutine id read from its stack, a
// microsecond: invariants builds only). Without the tag Owner is an empty struct.
//
// Who may call what: anyone; the package holds no state (an Owner is its holder's).
package invariants
