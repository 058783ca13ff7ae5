package subscriber

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A hostile replay socket: replies out of order, or before what was asked for, fail
// the replay instead of moving the worker's sequence.
func TestHostileReplayRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		seqs []uint64
	}{
		{"jump after a reply", []uint64{1, 2, 1_090_000}},
		{"backwards", []uint64{1, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t)
			fp := &fakePub{}
			s := newTestSub(t, e, fp, true)
			e0, _ := stored(nil, [2]uint64{1, 100})
			fp.add(0, batch(e0))
			sendLive(t, s, 0, batch(e0))
			for _, q := range tc.seqs {
				fp.buf = append(fp.buf, fakeBatch{q, batch(ev{kind: "cleared"})})
			}
			sendLive(t, s, 5, batch(e0)) // a gap: the catch-up meets the hostile replies
			st := s.Status()
			if st.ReplayFailures != 1 || st.LastSeq != 5 || !strings.Contains(st.LastError, "malformed replay reply") {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// A replay socket whose first reply comes before the sequence asked for fails the
// replay (fakePub honours from, so this one answers from-1 regardless).
func TestHostileReplayBeforeStart(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	payload := batch(ev{kind: "cleared"})
	for q := range uint64(3) {
		fp.add(q, payload)
		sendLive(t, s, q, payload)
	}
	var asked []uint64
	s.replay = func(_ context.Context, from uint64, fn func(uint64, []byte) bool) error {
		asked = append(asked, from)
		if from > 0 {
			fn(from-1, payload)
		}
		return nil
	}
	sendLive(t, s, 5, payload) // a gap: the catch-up meets the early reply
	st := s.Status()
	if len(asked) == 0 || asked[0] == 0 || st.ReplayFailures != 1 || st.LastSeq != 5 ||
		!strings.Contains(st.LastError, "malformed replay reply") {
		t.Fatalf("asked %v, status %+v", asked, st)
	}
}

// A catch-up for a live gap stops at the live batch: a buffer that runs far past it
// (hostile or not) cannot move the worker's sequence beyond the live stream.
func TestGapCatchUpStopsAtLiveSeq(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	payload := batch(ev{kind: "cleared"})
	for q := range uint64(5000) {
		fp.add(q, payload)
	}
	sendLive(t, s, 0, payload)
	sendLive(t, s, 10, payload)
	if st := s.Status(); st.LastSeq != 10 || st.GapsRecovered != 1 || st.State != StateLive {
		t.Fatalf("status %+v", st)
	}
	sendLive(t, s, 11, payload)
	if st := s.Status(); st.LastSeq != 11 || st.Duplicates != 1 { // the live 10 the replay applied
		t.Fatalf("live batches after the catch-up: %+v", st)
	}
}

// An undecodable batch the engine keeps buffering is counted once however often a
// resync replays it.
func TestUndecodableBufferCountedOnce(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	e0, _ := stored(nil, [2]uint64{1, 100})
	fp.add(0, batch(e0))
	for q := uint64(1); q <= 5; q++ {
		fp.add(q, []byte{0xc1}) // never valid msgpack
	}
	sendLive(t, s, 0, batch(e0))
	for q := uint64(1); q <= 5; q++ {
		sendLive(t, s, q, []byte{0xc1})
	}
	for range 3 {
		if err := s.resync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s.publish()
	if st := s.Status(); st.Rejected[ReasonMalformedBatch] != 5 || st.State != StateStale {
		t.Fatalf("5 bad payloads, 3 resyncs: %+v", st)
	}
}

// countHandler counts the records it gets.
type countHandler struct{ n atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// 2,000 warnings in a row (as a hostile replay once caused) log a bounded number of
// lines: the burst, then one per second of elapsed time.
func TestWarningsRateLimited(t *testing.T) {
	e := newEngine(t)
	h := &countHandler{}
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: e, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 2000 {
		s.warn("test warning")
	}
	limit := int64(warnBurst) + 1 + int64(time.Since(start)/warnEvery)
	if n := h.n.Load(); n < warnBurst || n > limit {
		t.Fatalf("%d warnings logged, want between %d and %d", n, warnBurst, limit)
	}
	var l warnLimiter
	now := time.Unix(1000, 0)
	for range warnBurst {
		if ok, _ := l.allow(now); !ok {
			t.Fatal("burst refused")
		}
	}
	if ok, _ := l.allow(now); ok {
		t.Fatal("past the burst allowed")
	}
	if ok, n := l.allow(now.Add(warnEvery)); !ok || n != 1 {
		t.Fatalf("after %v: ok %v suppressed %d, want true 1", warnEvery, ok, n)
	}
}
