//go:build race

package rwlock

import "sync"

// RWMutex is sync.RWMutex under the race detector: the detector takes every atomic for
// a happens-before edge, so this package's lock (rwlock.go), built on one atomic word,
// would order each reader after the last (two readers writing the same memory would go
// unreported), where sync.RWMutex tells the detector only its writer-to-reader,
// reader-to-writer and writer-to-writer edges. A race build keeps those.
type RWMutex = sync.RWMutex
