package engine

// The tuner: how many leading positions round 1 probes one by one, chosen per window of
// queries from the scores the last window saw (noteDense).

// denseLandings is how many leading positions round 1 probes one by one, at most; the
// engine probes denseShort instead while the queries it answers let it (noteDense). Most
// queries' best score is a handful of blocks (on the trace-driven logs the median is 8),
// and a gap-free worker that drops out among positions that were all probed has its
// score without round 2: a few extra probes in a batch that goes out anyway cost less
// than a second round trip through the shards. Which few depends on the workload: on
// both trace logs (an 8-block system prompt) 8 against 16 takes probes per query at rest
// from 22.3 to 15.6 (conversation trace) and 22.5 to 15.9 (trace16) for 0.3% and 1%
// more round trips (go test -run '^$' -bench QueryWork -benchtime 3x ./engine/, one
// shard; when it was chosen, 23.7 to 17.0 and 24.1 to 17.5), and in four alternated runs of
// kvindex bench --impls engine --shards 1,2 --producers 1 --no-verify p50 at rest from
// 1.99-2.08 to 1.79-1.80 us at 1 shard and 2.30-2.35 to 1.97-2.02 at 2; but with a
// system prompt of 9 to 16 blocks 8 would cost most queries a round trip (about 1 us)
// to save 7 probes (about 0.2 us).
const (
	denseLandings = 16
	denseShort    = 8
)

// denseWindow and denseMaxNear drive noteDense: every denseWindow sharded queries the
// engine probes denseShort dense positions for the next window if at most denseMaxNear
// of them had a candidate scoring in (denseShort, denseLandings], the scores a short
// dense prefix sends to round 2 and a full one does not, and denseLandings otherwise.
// The break-even is near one query in six (7 probes against a round trip); 1 in 16
// keeps the short prefix to workloads that clearly do not pay for it.
const (
	denseWindow  = 256
	denseMaxNear = denseWindow / 16
)

// nearDense reports whether a scored candidate of q scored in (denseShort,
// denseLandings].
func (q *query) nearDense() bool {
	for i := range q.cands {
		if s := q.cands[i].score; s > denseShort && s <= denseLandings {
			return true
		}
	}
	return false
}

// noteDense counts one sharded query (near: nearDense) and, at the end of each window,
// sets how many dense landings the next window probes. The counter packs the window's
// queries (low 32 bits) and its near ones (high 32 bits) in one atomic add; the one
// caller whose add completes a window resets it (adds racing with the reset are lost,
// which only shortens the next window's count). Answers do not depend on the choice:
// jump search is exact for any landings.
func (e *Engine) noteDense(near bool) {
	if e.hooks.denseFixed {
		return
	}
	add := uint64(1)
	if near {
		add |= 1 << 32
	}
	v := e.denseStats.Add(add)
	if uint32(v) != denseWindow {
		return
	}
	e.denseStats.Store(0)
	d := int32(denseLandings)
	if v>>32 <= denseMaxNear {
		d = denseShort
	}
	e.dense.Store(d)
}
