package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/engine/internal/predict"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/shard"
)

// Predictions: a router that sends a request to a worker records that the worker is
// about to hold the request's blocks (Predict). Until the worker's own events arrive
// (tens to hundreds of milliseconds later) queries count the prediction, so sibling
// requests follow the first one instead of scattering; for workers that publish no
// events at all the predictions are the whole index ("approximate" routing).
//
// The semantics, which DESIGN.md ("Predictions") states as part of the contract and the
// reference model (internal/refmodel) implements independently:
//
//   - A prediction is (worker, namespace, P = content hashes of n >= 1 blocks, expiry).
//     It is live from Predict until its expiry (now + ttl by Config.Clock) or until it
//     ends.
//   - It ends when the worker's events cover or contradict it: a clear or a removal of
//     the worker (known to the index or not); an accepted stored event of the worker in
//     the prediction's namespace that stores P's last block under P's prefix (the
//     prediction is confirmed: from then on the confirmed index answers for it); an
//     accepted removed event that removes a seq the worker holds at a key of P (a
//     confirmed block of P was evicted). A new prediction of the same worker, namespace
//     and P replaces the old one (a refresh: new expiry, newest again).
//   - Bounds: a worker keeps at most Config.PredictionsPerWorker live predictions and the
//     engine at most Config.PredictedBlocks blocks in all of them; a Predict that would
//     exceed either first ends the oldest (the worker's own oldest for the first bound,
//     the engine's oldest for the second).
//   - A query Q in namespace ns gives each worker a predicted length p = the longest
//     common prefix of Q with any of its live predictions in ns, next to its confirmed
//     score c (exact, untouched by predictions). The worker matches when max(c, p) >= 1,
//     with Score = max(c, p) and Predicted = Score - c. A worker known only through
//     predictions has Size 0.
//
// Structure: the table is package engine/internal/predict, one owner (the holder of
// its RWMutex: queries read, Predict and the events of workers with predictions write,
// an event after its worker's mutex). This file is the engine's side: the checks of
// Predict, the event hooks and the merge into answers. While the engine holds no
// predictions (Live == 0) queries and events pay one atomic load.

// Limits on the prediction configuration.
const (
	// MaxPredictionsPerWorker bounds Config.PredictionsPerWorker.
	MaxPredictionsPerWorker = 1 << 16
	// MaxPredictedBlocks bounds Config.PredictedBlocks (16 bytes a block: 1 GiB).
	MaxPredictedBlocks = 1 << 26
	// MaxPredictionTTL bounds Config.PredictionTTL and Predict's ttl.
	MaxPredictionTTL = 10 * time.Minute
)

// PredictionStats describes the prediction table.
type PredictionStats struct {
	// Predictions is the number of predictions held (expired ones not yet freed
	// included); Blocks their total length.
	Predictions, Blocks int
	// Workers is the number of workers with at least one prediction held.
	Workers int
}

// PredictionStats returns a snapshot of the prediction table.
func (e *Engine) PredictionStats() PredictionStats {
	p := &e.preds
	p.RLock()
	defer p.RUnlock()
	n, blocks, workers := p.Stats()
	return PredictionStats{Predictions: n, Blocks: blocks, Workers: workers}
}

func (e *Engine) now() int64 {
	if e.cfg.Clock == nil {
		return time.Now().UnixNano()
	}
	return e.cfg.Clock().UnixNano()
}

// Predict records that worker is about to hold the blocks of content in namespace (the
// content hashes of a request just routed to it), for ttl (0: Config.PredictionTTL).
// Queries count the prediction until it expires or the worker's events cover or
// contradict it (see DESIGN.md, "Predictions"). An empty content is a no-op. It returns
// an error wrapping ErrInvalidEvent for an empty worker, a negative ttl or one above
// MaxPredictionTTL, or more blocks than Config.MaxEventBlocks or Config.PredictedBlocks;
// ErrQueryTooLong for MaxDepth blocks or more; ctx.Err() or ErrClosed. A new namespace
// is interned while the namespace table holds less than half of Config.NamespaceBytes
// (ErrInvalidEvent beyond), and dropped by a sweep once no block or live prediction
// uses it.
func (e *Engine) Predict(ctx context.Context, worker, namespace string, content []uint64, ttl time.Duration) error {
	err := e.predict(ctx, worker, namespace, content, ttl)
	e.maybeSweepNamespaces()
	return err
}

func (e *Engine) predict(ctx context.Context, worker, namespace string, content []uint64, ttl time.Duration) error {
	if e.closed.Load() {
		return e.err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: prediction: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	switch {
	case worker == "":
		return bad("empty worker id")
	case len(worker) > MaxWorkerLen:
		return bad("worker id of %d bytes (limit %d)", len(worker), MaxWorkerLen)
	case len(namespace) > MaxNamespaceLen:
		return bad("namespace of %d bytes (limit %d)", len(namespace), MaxNamespaceLen)
	case ttl < 0 || ttl > MaxPredictionTTL:
		return bad("ttl %v, want 0..%v", ttl, MaxPredictionTTL)
	case len(content) >= MaxDepth:
		return fmt.Errorf("%w: %d blocks (limit %d)", ErrQueryTooLong, len(content), MaxDepth-1)
	case len(content) > e.cfg.MaxEventBlocks || len(content) > e.cfg.PredictedBlocks:
		return bad("%d blocks (limit %d)", len(content), min(e.cfg.MaxEventBlocks, e.cfg.PredictedBlocks))
	case len(content) == 0:
		return nil
	}
	if ttl == 0 {
		ttl = e.cfg.PredictionTTL
	}
	// The entry's own copy of content and its prefix hashes share one allocation (they
	// live and die together), computed outside the lock.
	n := len(content)
	buf := make([]uint64, 2*n)
	own, pre := buf[:n:n], buf[n:]
	copy(own, content)
	pre[0] = content[0]
	e.env.Chain.Fill(pre, content, 1)

	p := &e.preds
	p.Lock()
	defer p.Unlock()
	ns := uint32(0)
	if namespace != "" {
		// A query in it must find it, so a new namespace is interned, under the
		// prediction lock: a sweep reads the predictions under it (namespaces.go).
		// Predictions (a client's word, unlike events) may fill half the table.
		if ns = e.namespaceID(namespace, nsPredicted); ns == 0 {
			return fmt.Errorf("%w (Config.NamespaceBytes %d, half of it for predictions)", ErrNamespaceTableFull, e.cfg.NamespaceBytes)
		}
	}
	root := e.fingerprint(shard.Key{Prefix: content[0], NS: ns})
	now := e.now()
	p.Insert(worker, ns, own, pre, root, now, now+int64(ttl), e.cfg.PredictionsPerWorker, e.cfg.PredictedBlocks)
	return nil
}

// predictedEvent applies an event to w (locked) when the engine holds predictions: the
// event itself (applyEvent), then the end of the worker's predictions it covers or
// contradicts. The prediction lock is taken after the worker's, like everywhere.
func (e *Engine) predictedEvent(w *worker.Worker, ev *Event) (gone bool, err error) {
	p := &e.preds
	if ev.Tier != TierDevice {
		return e.applyEvent(w, ev) // predictions are of device blocks: other tiers' events leave them
	}
	// Most events are of workers without predictions: a shared look first, so that they
	// do not serialise on the table. A Predict for w that slips in before the event is
	// applied is then as if it came right after the event (its confirmed part covers it
	// in queries anyway).
	p.RLock()
	has := p.Has(w.Name())
	p.RUnlock()
	if !has {
		return e.applyEvent(w, ev)
	}
	p.Lock()
	defer p.Unlock()
	pw := p.Worker(w.Name())
	if pw == nil {
		return e.applyEvent(w, ev)
	}
	p.ResetMarks()
	switch ev.Kind {
	case EventCleared, EventRemoveWorker:
		p.EndWorker(w.Name())
	case EventRemoved:
		// Before the removal: which of the removed seqs the worker holds at a key of a
		// prediction.
		for _, s := range ev.Seqs {
			if k, ok := w.KeyOf(&e.env, s); ok {
				p.MarkHeld(pw, k.NS, k.Pos, k.Prefix)
			}
		}
	case EventStored:
		return e.confirmingStore(w, ev, pw)
	}
	gone, err = e.applyEvent(w, ev)
	p.EndMarked()
	return gone, err
}

// confirmingStore applies a stored event and then ends the worker's predictions in its
// namespace whose last key the event stored. The event's keys are computed from its
// parent's key (read before the event, which may move the parent's seq) and its blocks.
func (e *Engine) confirmingStore(w *worker.Worker, ev *Event, pw *predict.Worker) (bool, error) {
	p := &e.preds
	var prefix uint64
	var pos uint32
	if ev.HasParent {
		pk, ok := w.FindParent(&e.env, worker.Tier(ev.Tier), ev.Parent)
		if !ok {
			return e.applyEvent(w, ev) // rejected: nothing to confirm
		}
		prefix, pos = pk.Key.Prefix, pk.Key.Pos+1
	}
	gone, err := e.applyEvent(w, ev)
	if err != nil {
		return gone, err
	}
	ns := uint32(0)
	if ev.Namespace != "" {
		ns = e.namespaceID(ev.Namespace, nsFind)
	}
	p.ResetMarks()
	for i, b := range ev.Blocks {
		if i == 0 && !ev.HasParent {
			prefix = b.Content
		} else {
			prefix = e.env.Chain.Step(prefix, b.Content, pos+uint32(i))
		}
		p.MarkConfirmed(pw, ns, int(pos)+i, prefix)
	}
	p.EndMarked()
	return gone, nil
}

// predictionsFor ends the predictions of an event's worker that is not known to the
// index (a clear or a removal of a worker known only through predictions).
func (e *Engine) predictionsFor(ev *Event) {
	if ev.Kind != EventCleared && ev.Kind != EventRemoveWorker {
		return
	}
	p := &e.preds
	p.Lock()
	p.EndWorker(ev.Worker)
	p.Unlock()
}

// addPredicted merges the live predictions into a query's answer dst[start:] (sorted
// by sortMatches): a worker whose predicted length beats its confirmed score gets
// Score = the predicted length and Predicted = the difference; a worker with a
// predicted length and no confirmed match is added. Nothing is allocated beyond dst's
// growth: the hits go into the pooled query's scratch.
func (e *Engine) addPredicted(q *query, ns uint32, content []uint64, dst []Match, start int) []Match {
	p := &e.preds
	root := e.fingerprint(shard.Key{Prefix: content[0], NS: ns})
	p.RLock()
	defer p.RUnlock()
	hits := p.AppendHits(q.phits[:0], root, ns, content, q.byPrefix(), e.now())
	q.phits = hits
	changed := false
	for _, h := range hits {
		i := start
		for ; i < len(dst) && dst[i].Worker != h.Worker; i++ {
		}
		if i < len(dst) {
			if m := &dst[i]; h.N > m.Score {
				m.Predicted, m.Score = h.N-m.Score, h.N
				changed = true
			}
			for t := range dst[i].Tiers {
				dst[i].Tiers[t] = max(dst[i].Tiers[t], h.N) // predicted blocks are device blocks
			}
			continue
		}
		size := 0
		if w := e.lookup(h.Worker); w != nil {
			size = w.TotalSize()
		}
		dst = append(dst, Match{Worker: h.Worker, Score: h.N, Size: size, Predicted: h.N, Tiers: [NumTiers]int{h.N, h.N, h.N}})
		changed = true
	}
	if changed {
		q.sortMatches(dst[start:])
	}
	return dst
}

// WorkerPrediction is one worker's predicted length for a query (PredictedIn).
type WorkerPrediction struct {
	// Worker is the worker's id as given to Predict.
	Worker string
	// Blocks is the longest common prefix of the query with any of the worker's live
	// predictions in the query's namespace: at least 1.
	Blocks int
}

// PredictedIn appends to dst, for every worker with a live prediction in namespace that
// shares at least the query's first block, its predicted length, whatever its confirmed
// score (FindMatchesIn merges the two, so a prediction shorter than the confirmed
// blocks does not show there): the score a router falls back to when it cannot trust a
// worker's events (package server's trust states). The order is unspecified. It reads
// the prediction table under its read lock, allocates nothing beyond dst's growth, and
// answers an empty query, an unknown namespace and an engine without predictions with
// dst unchanged; it never blocks on the shards and answers after Close too.
func (e *Engine) PredictedIn(namespace string, content []uint64, dst []WorkerPrediction) []WorkerPrediction {
	return e.predictedIn(namespace, content, false, dst)
}

// PredictedByPrefixIn is PredictedIn for a query given by its prefix hashes
// (FindMatchesByPrefixIn); on an engine not on SPEC's chain it answers dst unchanged.
func (e *Engine) PredictedByPrefixIn(namespace string, prefixes []uint64, dst []WorkerPrediction) []WorkerPrediction {
	if !e.env.Chain.Spec() {
		return dst
	}
	return e.predictedIn(namespace, prefixes, true, dst)
}

// predictedIn is PredictedIn; byPrefix says content holds prefix hashes.
func (e *Engine) predictedIn(namespace string, content []uint64, byPrefix bool, dst []WorkerPrediction) []WorkerPrediction {
	p := &e.preds
	if len(content) == 0 || p.Live() == 0 {
		return dst
	}
	ns := uint32(0)
	if namespace != "" {
		if ns = e.namespaceID(namespace, nsFind); ns == 0 {
			return dst
		}
	}
	root := e.fingerprint(shard.Key{Prefix: content[0], NS: ns})
	p.RLock()
	defer p.RUnlock()
	return predict.AppendEach(p, dst, root, ns, content, byPrefix, e.now(), func(w string, n int) WorkerPrediction {
		return WorkerPrediction{Worker: w, Blocks: n}
	})
}
