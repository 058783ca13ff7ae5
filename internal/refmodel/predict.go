package refmodel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvindex/kvindex/internal/oplog"
)

// Predictions, as the contract states them (DESIGN.md, "Predictions"): the obvious
// version. The model keeps every prediction in one list in insertion order and decides
// everything by walking it; its clock is a duration advanced by Advance.

// Prediction limits; the model's defaults are the engine's.
const (
	DefaultPredictionsPerWorker = 64
	DefaultPredictedBlocks      = 1 << 20
	DefaultPredictionTTL        = 2 * time.Second
)

type prediction struct {
	worker  string
	content []uint64
	expires time.Duration
}

// predictionState is the Model's share for predictions.
type predictionState struct {
	now   time.Duration
	preds []prediction // insertion order, live and expired
	// The limits (engine.Config's fields of the same names); zero means the default.
	PredictionsPerWorker, PredictedBlocks int
	PredictionTTL                         time.Duration
}

// Advance moves the model's clock forward by d.
func (m *Model) Advance(d time.Duration) { m.now += d }

// live drops the expired predictions: an expired prediction is as good as none.
func (m *Model) live() {
	m.preds = slices.DeleteFunc(m.preds, func(p prediction) bool { return p.expires <= m.now })
}

// Predict records a prediction: worker is about to hold content, for ttl (0: the
// default TTL). It returns ErrInvalidEvent for an empty worker, a negative ttl or more
// blocks than the block bound.
func (m *Model) Predict(worker string, content []uint64, ttl time.Duration) error {
	perWorker, blocks := m.PredictionsPerWorker, m.PredictedBlocks
	if perWorker == 0 {
		perWorker = DefaultPredictionsPerWorker
	}
	if blocks == 0 {
		blocks = DefaultPredictedBlocks
	}
	if ttl == 0 {
		ttl = m.PredictionTTL
		if ttl == 0 {
			ttl = DefaultPredictionTTL
		}
	}
	switch {
	case worker == "" || ttl < 0 || len(content) > blocks:
		return ErrInvalidEvent
	case len(content) == 0:
		return nil
	}
	m.live()
	// the same prediction is replaced
	m.preds = slices.DeleteFunc(m.preds, func(p prediction) bool {
		return p.worker == worker && slices.Equal(p.content, content)
	})
	// the worker's oldest go while it has perWorker
	for {
		n, oldest := 0, -1
		for i, p := range m.preds {
			if p.worker == worker {
				if oldest < 0 {
					oldest = i
				}
				n++
			}
		}
		if n < perWorker {
			break
		}
		m.preds = slices.Delete(m.preds, oldest, oldest+1)
	}
	// the engine's oldest go while the blocks do not fit
	for {
		total := len(content)
		for _, p := range m.preds {
			total += len(p.content)
		}
		if total <= blocks {
			break
		}
		m.preds = m.preds[1:]
	}
	m.preds = append(m.preds, prediction{worker: worker, content: slices.Clone(content), expires: m.now + ttl})
	return nil
}

// endPredictions drops the worker's predictions that end reports true for.
func (m *Model) endPredictions(worker string, end func(p prediction) bool) {
	m.preds = slices.DeleteFunc(m.preds, func(p prediction) bool { return p.worker == worker && end(p) })
}

// node returns the trie node of content's first n blocks, or 0 if there is none.
func (m *Model) node(content []uint64, n int) uint32 {
	var at uint32
	for _, c := range content[:n] {
		next, ok := m.nodes[nodeKey{at, c}]
		if !ok {
			return 0
		}
		at = next
	}
	return at
}

// predicted returns each worker's predicted length for a query: the longest common
// prefix of the query with any of its live predictions.
func (m *Model) predicted(content []uint64) map[string]int {
	out := map[string]int{}
	for _, p := range m.preds {
		if p.expires <= m.now {
			continue
		}
		n := 0
		for n < len(p.content) && n < len(content) && p.content[n] == content[n] {
			n++
		}
		if n > out[p.worker] {
			out[p.worker] = n
		}
	}
	return out
}

// Step is one step of a history with predictions: an op of the log (Op), a prediction
// (Predict set) or an advance of the clock (Advance > 0).
type Step struct {
	Op      oplog.Op
	Predict *Prediction
	Advance time.Duration
}

// Prediction is a Predict call.
type Prediction struct {
	Worker  string
	Content []uint64
	TTL     time.Duration
}

// ApplyStep applies a step that is not a query and returns the event's or the
// prediction's rejection.
func (m *Model) ApplyStep(s *Step) error {
	switch {
	case s.Predict != nil:
		return m.Predict(s.Predict.Worker, s.Predict.Content, s.Predict.TTL)
	case s.Advance > 0:
		m.Advance(s.Advance)
		return nil
	}
	return m.Apply(&s.Op)
}

// Steps wraps ops as steps.
func Steps(ops []oplog.Op) []Step {
	out := make([]Step, len(ops))
	for i := range ops {
		out[i].Op = ops[i]
	}
	return out
}

// RandomSteps is RandomOps with predictions and clock advances mixed in: predictions of
// the prefixes that queries ask (whole, cut, extended or diverging) for the event
// workers and for one worker ("p0") that sends no events, with TTLs of 1-60 ms and
// advances of 1-20 ms, so that predictions expire, get confirmed, contradicted and
// evicted.
func RandomSteps(r *rand.Rand, n int, opt RandomOptions) []Step {
	ops := RandomOps(r, n, opt)
	workers := opt.Workers
	if workers == 0 {
		workers = 5
	}
	var queries [][]uint64
	for i := range ops {
		if ops[i].Kind == oplog.Query && len(ops[i].Content) > 0 {
			queries = append(queries, ops[i].Content)
		}
	}
	var out []Step
	for i := range ops {
		out = append(out, Step{Op: ops[i]})
		if len(queries) == 0 {
			continue
		}
		switch k := r.IntN(10); {
		case k < 3:
			c := slices.Clone(queries[r.IntN(len(queries))])
			switch r.IntN(4) {
			case 0:
				c = c[:r.IntN(len(c)+1)]
			case 1:
				c = append(c, uint64(1+r.IntN(3)), uint64(1+r.IntN(3)))
			case 2:
				if len(c) > 0 {
					c[r.IntN(len(c))] = uint64(1 + r.IntN(3))
				}
			}
			w := fmt.Sprintf("w%d", r.IntN(workers))
			if r.IntN(5) == 0 {
				w = "p0"
			}
			out = append(out, Step{Predict: &Prediction{Worker: w, Content: c, TTL: time.Duration(1+r.IntN(60)) * time.Millisecond}})
		case k < 5:
			out = append(out, Step{Advance: time.Duration(1+r.IntN(20)) * time.Millisecond})
		}
	}
	return out
}
