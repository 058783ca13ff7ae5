package subscriber_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/subscriber"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// Interop tests: the subscriber against publisher.py, which speaks vLLM's protocol
// through the real libzmq. They skip when no python3 with zmq and msgpack is found.

const (
	bs    = 4
	model = "m"
)

var ns = subscriber.Namespace(model, "")

func tokens(c uint64) []uint32 { return []uint32{uint32(c), 3, 5, uint32(c >> 32)} }

func content(c uint64) uint64 { return hash.Content(tokens(c)) }

// harness is one engine, one publisher and one subscriber per rank.
type harness struct {
	t      *testing.T
	eng    *engine.Engine
	pub    *pubtest.Publisher
	subs   []*subscriber.Subscriber
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

func newHarness(t *testing.T, opts pubtest.Options, mod func(*subscriber.Config)) *harness {
	t.Helper()
	pubtest.Require(t)
	pub, err := pubtest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, pub: pub, errs: make(chan error, 16)}
	t.Cleanup(h.close)
	h.eng, err = engine.New(engine.Config{Shards: 2, JumpSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	for _, r := range pub.Ranks {
		cfg := subscriber.Config{
			Endpoint:       r.Endpoint,
			ReplayEndpoint: r.ReplayEndpoint,
			Worker:         subscriber.WorkerID("engine", r.Rank, len(pub.Ranks) > 1),
			Model:          model,
			DPRank:         r.Rank,
			BlockSize:      bs,
			Index:          h.eng,
			Topic:          opts.Topic,
			ReconnectMin:   10 * time.Millisecond,
			ReconnectMax:   100 * time.Millisecond,
			ReplayTimeout:  3 * time.Second,
		}
		if mod != nil {
			mod(&cfg)
		}
		s, err := subscriber.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.subs = append(h.subs, s)
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := s.Run(ctx); err != nil {
				h.errs <- err
			}
		}()
	}
	return h
}

func (h *harness) close() {
	h.cancel()
	h.wg.Wait()
	h.pub.Close()
	h.eng.Close()
	close(h.errs)
	for err := range h.errs {
		h.t.Errorf("Run: %v", err)
	}
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition, not a synchronising sleep
	}
}

// waitSynced waits until every subscriber finished its first catch-up.
func (h *harness) waitSynced() {
	h.t.Helper()
	for _, s := range h.subs {
		waitFor(h.t, 15*time.Second, s.Worker()+" synced", func() bool { return s.Status().Synced })
	}
}

// waitSeq waits until subscriber i has applied sequence seq (and its state is not
// stale unless allowed), then takes a barrier.
func (h *harness) waitSeq(i int, seq uint64) {
	h.t.Helper()
	s := h.subs[i]
	deadline := time.Now().Add(20 * time.Second)
	for st := s.Status(); !st.HasSeq || st.LastSeq != seq; st = s.Status() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s at seq %d: %+v", s.Worker(), seq, st)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.eng.Barrier(ctx); err != nil {
		h.t.Fatal(err)
	}
}

// check compares the engine's answers with the model's.
func (h *harness) check(m *refmodel.Model, queries [][]uint64) {
	h.t.Helper()
	ctx := context.Background()
	for _, q := range queries {
		got, err := h.eng.FindMatchesIn(ctx, ns, q, nil)
		if err != nil {
			h.t.Fatal(err)
		}
		want := m.Query(q)
		sort.Slice(got, func(i, j int) bool {
			if got[i].Score != got[j].Score {
				return got[i].Score > got[j].Score
			}
			return got[i].Worker < got[j].Worker
		})
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = got[i].Worker == want[i].Worker && got[i].Score == want[i].Score && got[i].Size == want[i].Size
		}
		if !ok {
			h.t.Fatalf("query %v: engine %v, model %v", q, got, want)
		}
	}
}

// wireEvent turns an op into a wire event (content values become token blocks) and
// applies it to the model.
func wireEvent(op oplog.Op, m *refmodel.Model, r *rand.Rand) pubtest.Event {
	e, blocks := pubtest.FromOp(&op, bs, tokens)
	e.Encoding = "array"
	if r.IntN(2) == 0 {
		e.Encoding = "map"
	}
	switch op.Kind {
	case oplog.Stored:
		m.Stored(op.Worker, op.Parent, op.HasParent, blocks)
	case oplog.Removed:
		m.Removed(op.Worker, op.Seqs)
	default:
		m.Cleared(op.Worker)
	}
	return e
}

// stream publishes a random history over the ranks in batches of 1-4 events, with
// every lostEvery-th batch lost on the wire (buffered only). It returns the queries and
// each rank's last sequence.
func (h *harness) stream(r *rand.Rand, m *refmodel.Model, nops, lostEvery int) ([][]uint64, []uint64) {
	h.t.Helper()
	workers := make([]string, len(h.subs))
	for i, s := range h.subs {
		workers[i] = s.Worker()
	}
	ops := refmodel.RandomOps(r, nops, refmodel.RandomOptions{Workers: len(workers), MaxChain: 40})
	var queries [][]uint64
	last := make([]uint64, len(workers))
	pending := make([][]pubtest.Event, len(workers))
	batches := 0
	flush := func(w int) {
		if len(pending[w]) == 0 {
			return
		}
		batches++
		send := lostEvery == 0 || batches%lostEvery != 0
		seq, err := h.pub.Publish(w, send, pending[w]...)
		if err != nil {
			h.t.Fatal(err)
		}
		last[w] = seq
		pending[w] = nil
	}
	for _, op := range ops {
		if op.Kind == oplog.Query {
			q := make([]uint64, len(op.Content))
			for i, c := range op.Content {
				q[i] = content(c)
			}
			queries = append(queries, q)
			continue
		}
		var w int
		fmt.Sscanf(op.Worker, "w%d", &w)
		op.Worker = workers[w]
		pending[w] = append(pending[w], wireEvent(op, m, r))
		if len(pending[w]) >= 1+r.IntN(4) {
			flush(w)
		}
	}
	for w := range pending {
		flush(w)
	}
	// The last batch of each rank is sent live so that a lost tail is seen as a gap.
	for w := range workers {
		seq, err := h.pub.Publish(w, true)
		if err != nil {
			h.t.Fatal(err)
		}
		last[w] = seq
	}
	return queries, last
}

func TestInteropMixedStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts pubtest.Options
	}{
		{"v0.26-replay-topic", pubtest.Options{Ranks: 2, ConsecutivePorts: true, Bind: true, Topic: "kv-events"}},
		{"legacy-replay-no-topic", pubtest.Options{Ranks: 1, Bind: true, NoReplayTopic: true}},
		{"bytes-hashes", pubtest.Options{Ranks: 1, Bind: true, HashForm: "bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.opts, nil)
			if len(h.pub.Ranks) == 2 {
				a, b := h.pub.Ranks[0].Endpoint, h.pub.Ranks[1].Endpoint
				if want, _ := subscriber.OffsetEndpoint(a, 1); want != b {
					t.Fatalf("rank 1 endpoint %s, want %s (port + rank)", b, want)
				}
			}
			h.waitSynced()
			m := refmodel.New()
			r := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			queries, last := h.stream(r, m, 1500, 9) // every 9th batch lost mid-stream
			for i := range h.subs {
				h.waitSeq(i, last[i])
			}
			h.check(m, queries)
			for _, s := range h.subs {
				st := s.Status()
				if st.State != subscriber.StateLive || st.GapsDetected == 0 || st.GapsRecovered == 0 || st.GapsUnrecoverable != 0 {
					t.Fatalf("%s: %+v", s.Worker(), st)
				}
				if st.RejectedTotal() == 0 {
					t.Fatalf("%s: the random history has rejected events, none counted: %+v", s.Worker(), st)
				}
			}
		})
	}
}

func TestInteropCutOffRecoveredByReplay(t *testing.T) {
	h := newHarness(t, pubtest.Options{Bind: true}, nil)
	h.waitSynced()
	m := refmodel.New()
	r := rand.New(rand.NewPCG(11, 1))
	queries, last := h.stream(r, m, 300, 0)
	h.waitSeq(0, last[0])
	// Cut the subscriber off mid-stream: the publisher's socket closes, the subscriber
	// retries with backoff, batches published meanwhile stay buffered.
	if err := h.pub.Disconnect(0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "disconnect seen", func() bool { return !h.subs[0].Status().Connected })
	q2, _ := h.stream(r, m, 300, 0)
	queries = append(queries, q2...)
	st, err := h.pub.Do(map[string]any{"cmd": "stats"})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.pub.Reconnect(0); err != nil {
		t.Fatal(err)
	}
	h.waitSeq(0, st.Seqs[0]-1)
	h.check(m, queries)
	s := h.subs[0].Status()
	if s.State != subscriber.StateLive || s.Disconnects == 0 || s.Connects < 2 || s.Restarts != 0 || s.GapsUnrecoverable != 0 ||
		s.GapsRecovered == 0 || s.Replays < 2 {
		t.Fatalf("status %+v", s)
	}
}

func TestInteropPublisherRestart(t *testing.T) {
	h := newHarness(t, pubtest.Options{Bind: true}, nil)
	h.waitSynced()
	m := refmodel.New()
	r := rand.New(rand.NewPCG(13, 1))
	_, last := h.stream(r, m, 200, 0)
	h.waitSeq(0, last[0])
	if err := h.pub.Restart(0); err != nil {
		t.Fatal(err)
	}
	// A new engine process: empty cache, sequence from 0.
	m.Cleared(h.subs[0].Worker())
	queries, last := h.stream(r, m, 100, 0)
	waitFor(t, 20*time.Second, "restart detected", func() bool { return h.subs[0].Status().Restarts >= 1 })
	h.waitSeq(0, last[0])
	h.check(m, queries)
	if st := h.subs[0].Status(); st.State != subscriber.StateLive || st.Restarts != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestInteropUnrecoverableGapThenClear(t *testing.T) {
	h := newHarness(t, pubtest.Options{Bind: true, BufferSteps: 3}, nil)
	h.waitSynced()
	w := h.subs[0].Worker()
	p := func(v uint64) *uint64 { return &v }
	store := func(send bool, parent *uint64, c, seq uint64) uint64 {
		t.Helper()
		s, err := h.pub.Publish(0, send, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{seq}, Parent: parent, TokenIDs: tokens(c), BlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	seq := store(true, nil, 1, 100)
	h.waitSeq(0, seq)
	for i := uint64(0); i < 6; i++ { // lost, and more than the buffer holds
		store(false, nil, 10+i, 200+i)
	}
	seq = store(true, p(205), 20, 300)
	h.waitSeq(0, seq)
	st := h.subs[0].Status()
	if st.State != subscriber.StateStale || st.GapsUnrecoverable != 1 {
		t.Fatalf("status %+v", st)
	}
	// What the index keeps: the blocks of the batches still buffered when the replay
	// was served (204, 205: vLLM appends a batch to the buffer after sending it, so the
	// live batch 300 took the third slot) and after; not 100 nor 200-203.
	m := refmodel.New()
	m.Stored(w, 0, false, [][2]uint64{{content(14), 204}})
	m.Stored(w, 0, false, [][2]uint64{{content(15), 205}})
	m.Stored(w, 205, true, [][2]uint64{{content(20), 300}})
	qs := [][]uint64{{content(1)}, {content(10)}, {content(13)}, {content(15), content(20)}}
	h.check(m, qs)
	// The engine resets its cache: the worker is exact again.
	seq, err := h.pub.Publish(0, true, pubtest.Event{Type: "AllBlocksCleared"})
	if err != nil {
		t.Fatal(err)
	}
	h.waitSeq(0, seq)
	if st := h.subs[0].Status(); st.State != subscriber.StateLive {
		t.Fatalf("after clear: %+v", st)
	}
	h.check(refmodel.New(), qs)
}

func TestInteropBindModeAndBadFrames(t *testing.T) {
	// vLLM connects when its endpoint names a host: the subscriber binds.
	pubtest.Require(t)
	ep := freeport.Endpoint(t)
	h := newHarness(t, pubtest.Options{Endpoint: ep}, func(c *subscriber.Config) {
		c.Endpoint, c.Bind = ep, true
	})
	h.waitSynced()
	// Nothing tells a bound socket that a publisher connected: it learns from the
	// first message (libzmq connects within its 100 ms reconnect interval). Publish
	// empty batches until one arrives; the ones lost before are replayed.
	deadline := time.Now().Add(10 * time.Second)
	for h.subs[0].Status().Messages == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no message reached the bound subscriber")
		}
		if _, err := h.pub.Publish(0, true); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // pacing of a bounded probe loop
	}
	m := refmodel.New()
	r := rand.New(rand.NewPCG(17, 1))
	queries, last := h.stream(r, m, 300, 5)
	h.waitSeq(0, last[0])
	h.check(m, queries)
	// An unsupported 24-byte sequence frame and a 2-frame message are counted, not
	// applied.
	if err := h.pub.Raw(0, []byte{}, make([]byte, 24), []byte{0x93}); err != nil {
		t.Fatal(err)
	}
	if err := h.pub.Raw(0, []byte{}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "bad messages counted", func() bool {
		st := h.subs[0].Status()
		return st.UnsupportedSeq == 1 && st.BadFrames == 1
	})
	// A re-sent old batch is a duplicate.
	if err := h.pub.Resend(0, last[0]-1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "duplicate skipped", func() bool { return h.subs[0].Status().Duplicates >= 1 })
	h.check(m, queries)
	if st := h.subs[0].Status(); st.State != subscriber.StateLive || st.LastSeq != last[0] {
		t.Fatalf("status %+v", st)
	}
}

func TestInteropGraceRemovesVanishedEngine(t *testing.T) {
	h := newHarness(t, pubtest.Options{Bind: true}, func(c *subscriber.Config) { c.Grace = 300 * time.Millisecond })
	h.waitSynced()
	seq, err := h.pub.Publish(0, true, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{1}, TokenIDs: tokens(1), BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	h.waitSeq(0, seq)
	if h.eng.Stats().Workers != 1 {
		t.Fatal("worker not known")
	}
	if err := h.pub.Disconnect(0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "worker removed after grace", func() bool {
		return h.subs[0].Status().State == subscriber.StateRemoved && h.eng.Stats().Workers == 0
	})
	// It comes back: synced from scratch (its buffer still has the batch).
	if err := h.pub.Reconnect(0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "worker back", func() bool {
		st := h.subs[0].Status()
		return st.State == subscriber.StateLive && st.HasSeq && st.LastSeq == seq && h.eng.Stats().Workers == 1
	})
}
