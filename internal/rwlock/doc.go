// Package rwlock owns one mechanism: a readers-writer lock whose uncontended writer
// takes and releases it with one compare-and-swap each.
//
// The engine's locked index (engine.Config.LockedIndex) takes its write lock once per
// applied event and its read lock once per query. With sync.RWMutex a write cycle is
// four atomic read-modify-writes (its writer mutex and its reader count, each way);
// on the 2-core VM the project is measured on each costs 5-9 ns, and in a profile of
// one call per event on the conversation trace (bench.BenchmarkEvents, locked index)
// the write lock's cycle took 38 of an event's 272 ns. RWMutex here packs the readers'
// count, the writer and a waiting flag into one word: a writer that meets no one
// needs one compare-and-swap each way, a reader one add each way, and anything else
// (a writer meeting readers or another writer, a reader meeting a writer) takes the
// slow path, a mutex and two conds, which schedules as sync.RWMutex does (a waiting
// writer blocks new readers; a writer's release hands the lock to every reader waiting
// then). BenchmarkWriteCycle and BenchmarkReadCycle compare it with sync.RWMutex: a
// write cycle 13 ns against 24 (sync.Mutex's is 12), a read cycle from both cores at
// once 27 ns against 27 (a query takes one; an event on the locked index one write).
//
// Under the race detector RWMutex is sync.RWMutex (rwlock_race.go): the detector would
// take the lock word's atomics for edges from each reader to the next and miss races
// between readers. Its tests therefore run without the detector: exclusion and torn
// writes checked by counters (TestExclusion), the hand-over and the writer's priority
// by the state the slow path reaches (no sleeps).
//
// Any goroutine may call any method; the word is an atomic, the slow path's counts
// belong to the holder of its mutex.
package rwlock
