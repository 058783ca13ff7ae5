package engine

// SetDenseLandings fixes how many dense landings e's queries probe (8 or 16), for the
// differential tests that hold both to the reference model. Call it before any query.
func SetDenseLandings(e *Engine, d int) {
	e.dense.Store(int32(d))
	e.hooks.denseFixed = true
}

// SetSpeculation fixes whether e's sharded queries send their next wave before the
// answers to the current one are back: always (true) or never (false). Call it before
// any query.
func SetSpeculation(e *Engine, always bool) {
	e.hooks.speculate = -1
	if always {
		e.hooks.speculate = 1
	}
}

// SweepNamespaces runs a namespace sweep now (namespaces.go), whenever the last one ran;
// false when another sweep or a snapshot's capture holds the sweep's lock.
func SweepNamespaces(e *Engine) bool { return e.sweepNamespaces(true) }

// CheckWorkers runs the structural checks of every worker's bookkeeping (worker.Worker.Check),
// digests recounted from scratch included, each under the worker's lock.
func CheckWorkers(e *Engine) error {
	ws := e.workers()
	for i := range ws {
		if w := ws[i].Load(); w != nil && !w.IsComponent() {
			e.lockWorker(w)
			err := w.Check(&e.env, true)
			e.unlockWorker(w)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// HoldShard takes shard i's table token for the caller, as a one-shard walk does, and
// returns the function that gives it back; false when the shard did not let it in. While
// it is held, queries cannot walk (or be served) on that shard.
func HoldShard(e *Engine, i int) (release func(), ok bool) {
	if _, ok := e.shards[i].Hold(); !ok {
		return nil, false
	}
	return e.shards[i].Let, true
}

// DefaultIndex is defaultIndex: the index the zero Config runs on procs cores.
func DefaultIndex(procs int) (shards int, locked bool) { return defaultIndex(procs) }
