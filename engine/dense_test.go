package engine

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoteDense: a window of queries with at most denseMaxNear near scores switches the
// engine to the short dense prefix, one with more switches it back, and each decision
// waits for a full window.
func TestNoteDense(t *testing.T) {
	e, err := New(Config{Shards: 1})
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, denseLandings, e.Stats().DenseLandings)
	window := func(near int) {
		for i := 0; i < denseWindow; i++ {
			e.noteDense(i < near)
		}
	}
	window(denseMaxNear)
	require.Equal(t, denseShort, e.Stats().DenseLandings)
	for i := 0; i < denseWindow-1; i++ {
		e.noteDense(true)
	}
	require.Equal(t, denseShort, e.Stats().DenseLandings, "not before the window ends")
	e.noteDense(true)
	require.Equal(t, denseLandings, e.Stats().DenseLandings)
	window(denseMaxNear + 1)
	require.Equal(t, denseLandings, e.Stats().DenseLandings)
	window(0)
	require.Equal(t, denseShort, e.Stats().DenseLandings)

	q := &query{cands: []candidate{{score: 3}, {score: denseShort}, {score: denseLandings + 1}}}
	require.False(t, q.nearDense())
	q.cands[1].score = denseShort + 1
	require.True(t, q.nearDense())
	q.cands[1].score = denseLandings
	require.True(t, q.nearDense())
}
