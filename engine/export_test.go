package engine

// SetDenseLandings fixes how many dense landings e's queries probe (8 or 16), for the
// differential tests that hold both to the reference model. Call it before any query.
func SetDenseLandings(e *Engine, d int) {
	e.dense.Store(int32(d))
	e.denseFixed = true
}
