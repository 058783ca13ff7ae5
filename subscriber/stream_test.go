package subscriber

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/kvevents"
)

// The sequence logic against an in-memory publisher: no sockets, every step explicit.

func p64(v uint64) *uint64 { return &v }

func TestInOrderDuplicatesAndGapRecovered(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	m := refmodel.New()

	e0, r0 := stored(nil, [2]uint64{1, 100}, [2]uint64{2, 101})
	e1, r1 := stored(p64(101), [2]uint64{3, 102})
	e2, r2 := stored(p64(102), [2]uint64{4, 103})
	e3 := ev{kind: "removed", seqs: []uint64{103}}
	e4, r4 := stored(p64(102), [2]uint64{5, 104})
	e4.asMap = true
	payloads := [][]byte{batch(e0), batch(e1), batch(e2), batch(e3), batch(e4)}
	for i, p := range payloads {
		fp.add(uint64(i), p)
	}
	m.Stored("w", 0, false, r0)
	m.Stored("w", 101, true, r1)
	m.Stored("w", 102, true, r2)
	m.Removed("w", []uint64{103})
	m.Stored("w", 102, true, r4)

	sendLive(t, s, 0, payloads[0])
	sendLive(t, s, 1, payloads[1])
	sendLive(t, s, 1, payloads[1]) // duplicate
	sendLive(t, s, 4, payloads[4]) // gap: 2 and 3 come from the replay
	st := s.Status()
	// Duplicates: the live repeat of 1, and the live 4 the replay already applied.
	if st.LastSeq != 4 || st.Duplicates != 2 || st.GapsDetected != 1 || st.GapsRecovered != 1 || st.GapsUnrecoverable != 0 {
		t.Fatalf("status %+v", st)
	}
	if got := fp.asked; len(got) != 1 || got[0] != 1 {
		t.Fatalf("replay asked from %v, want [1] (the last applied batch, for continuity)", got)
	}
	if st.State != StateLive || st.Stored != 4 || st.Removed != 1 {
		t.Fatalf("state %v stored %d removed %d", st.State, st.Stored, st.Removed)
	}
	if s.State() != st.State {
		t.Fatalf("State() %v, Status().State %v", s.State(), st.State)
	}
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1, 2, 3, 4), contents(1, 2, 3, 5), contents(1), contents(2)})
	// Another model's namespace sees nothing.
	got, _ := e.FindMatchesIn(context.Background(), Namespace("other", ""), contents(1, 2), nil)
	if len(got) != 0 {
		t.Fatalf("other model matched: %v", got)
	}
}

func TestGapNotBufferedInvalidates(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{maxLen: 2}
	s := newTestSub(t, e, fp, true)
	e0, _ := stored(nil, [2]uint64{1, 100})
	fp.add(0, batch(e0))
	sendLive(t, s, 0, batch(e0))
	var last []byte
	for i := uint64(1); i <= 5; i++ {
		ei, _ := stored(nil, [2]uint64{10 + i, 200 + i})
		last = batch(ei)
		fp.add(i, last)
	}
	sendLive(t, s, 5, last) // 1..3 are gone (buffer holds 4, 5)
	st := s.Status()
	if st.State != StateStale || st.GapsDetected != 1 || st.GapsUnrecoverable != 1 || st.GapsRecovered != 0 || st.Invalidations != 1 {
		t.Fatalf("status %+v", st)
	}
	if s.State() != StateStale {
		t.Fatalf("State() %v, want stale", s.State())
	}
	m := refmodel.New()
	_, r4 := stored(nil, [2]uint64{14, 204})
	_, r5 := stored(nil, [2]uint64{15, 205})
	m.Stored("w", 0, false, r4)
	m.Stored("w", 0, false, r5)
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1), contents(14), contents(15), contents(11)})

	// The engine clears its cache: exact again.
	fp.add(6, batch(ev{kind: "cleared"}))
	sendLive(t, s, 6, batch(ev{kind: "cleared"}))
	if st := s.Status(); st.State != StateLive || st.Resyncs != 1 {
		t.Fatalf("after clear: %+v", st)
	}
}

func TestGapWithoutReplayInvalidates(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	e0, _ := stored(nil, [2]uint64{1, 100})
	sendLive(t, s, 0, batch(e0))
	e2, r2 := stored(nil, [2]uint64{2, 101})
	sendLive(t, s, 2, batch(e2))
	st := s.Status()
	if st.State != StateStale || st.GapsUnrecoverable != 1 || st.Replays != 0 {
		t.Fatalf("status %+v", st)
	}
	m := refmodel.New()
	m.Stored("w", 0, false, r2)
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1), contents(2)})
}

func TestFailedReplayInvalidates(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	e0, _ := stored(nil, [2]uint64{1, 100})
	fp.add(0, batch(e0))
	sendLive(t, s, 0, batch(e0))
	fp.fail = true
	e2, _ := stored(nil, [2]uint64{2, 101})
	sendLive(t, s, 2, batch(e2))
	st := s.Status()
	if st.State != StateStale || st.ReplayFailures != 1+gapRetries || st.GapsUnrecoverable != 1 || len(fp.asked) != 1+gapRetries {
		t.Fatalf("status %+v, asked %v", st, fp.asked)
	}
	// Later, the publisher still buffers sequence 0: a resync rebuilds the worker.
	fp.fail = false
	fp.add(1, batch(ev{kind: "removed", seqs: []uint64{100}}))
	fp.add(2, batch(e2))
	if err := s.resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
	st = s.Status()
	if st.State != StateLive || st.Resyncs != 1 || st.LastSeq != 2 {
		t.Fatalf("after resync: %+v", st)
	}
	m := refmodel.New()
	_, r0 := stored(nil, [2]uint64{1, 100})
	_, r2 := stored(nil, [2]uint64{2, 101})
	m.Stored("w", 0, false, r0)
	m.Removed("w", []uint64{100})
	m.Stored("w", 0, false, r2)
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1), contents(2)})
}

// TestGapReplayRetried: a gap whose first replay fails in transit (a timeout) is
// caught up by the next attempt; the worker stays exact and live.
func TestGapReplayRetried(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	e0, r0 := stored(nil, [2]uint64{1, 100})
	fp.add(0, batch(e0))
	sendLive(t, s, 0, batch(e0))
	e1, r1 := stored(p64(100), [2]uint64{2, 101})
	fp.add(1, batch(e1))
	e2, r2 := stored(p64(101), [2]uint64{3, 102})
	fp.add(2, batch(e2))
	fp.failN = 1
	sendLive(t, s, 2, batch(e2))
	st := s.Status()
	if st.State != StateLive || st.ReplayFailures != 1 || st.GapsRecovered != 1 || st.GapsUnrecoverable != 0 ||
		st.Invalidations != 0 || st.LastSeq != 2 || len(fp.asked) != 2 {
		t.Fatalf("status %+v, asked %v", st, fp.asked)
	}
	m := refmodel.New()
	m.Stored("w", 0, false, r0)
	m.Stored("w", 100, true, r1)
	m.Stored("w", 101, true, r2)
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1, 2, 3)})
}

func TestRestartDetected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		replay bool
	}{{"replay", true}, {"no-replay", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t)
			fp := &fakePub{}
			s := newTestSub(t, e, fp, tc.replay)
			for i := uint64(0); i < 5; i++ {
				ei, _ := stored(nil, [2]uint64{i + 1, 100 + i})
				fp.add(i, batch(ei))
				sendLive(t, s, i, batch(ei))
			}
			// The connection drops; the engine restarts (sequence from 0, empty buffer,
			// empty cache) and publishes two batches before the subscriber is back.
			s.down(errors.New("connection reset"))
			fp.buf = nil
			n0, r0 := stored(nil, [2]uint64{50, 500})
			n1, r1 := stored(p64(500), [2]uint64{51, 501})
			fp.add(0, batch(n0))
			fp.add(1, batch(n1))
			s.up()
			if err := s.catchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !tc.replay {
				// Without replay, the first live message at or below the old position
				// tells.
				sendLive(t, s, 0, batch(n0))
				sendLive(t, s, 1, batch(n1))
			}
			s.setState()
			s.publish()
			st := s.Status()
			if st.Restarts != 1 || st.LastSeq != 1 || st.State != StateLive {
				t.Fatalf("status %+v", st)
			}
			m := refmodel.New()
			m.Stored("w", 0, false, r0)
			m.Stored("w", 500, true, r1)
			sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1), contents(50, 51), contents(3)})
		})
	}
}

func TestReconnectWithoutRestartKeepsState(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	m := refmodel.New()
	for i := uint64(0); i < 3; i++ {
		ei, ri := stored(nil, [2]uint64{i + 1, 100 + i})
		fp.add(i, batch(ei))
		sendLive(t, s, i, batch(ei))
		m.Stored("w", 0, false, ri)
	}
	s.down(errors.New("connection reset"))
	e3, r3 := stored(p64(102), [2]uint64{9, 109}) // published while disconnected
	fp.add(3, batch(e3))
	m.Stored("w", 102, true, r3)
	s.up()
	if err := s.catchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A queued live copy of an old batch: not a restart (the replay verifies).
	sendLive(t, s, 1, fp.buf[1].payload)
	st := s.Status()
	if st.Restarts != 0 || st.LastSeq != 3 || st.Duplicates == 0 || st.State != StateLive {
		t.Fatalf("status %+v", st)
	}
	sameAnswers(t, e, Namespace("m", ""), m, [][]uint64{contents(1), contents(3, 9), contents(2)})
}

func TestInitialHistoryLostIsStale(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	e7, _ := stored(nil, [2]uint64{7, 107})
	fp.add(7, batch(e7)) // the buffer has rotated past 0..6
	if err := s.catchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
	if st := s.Status(); st.State != StateStale || !st.Synced || st.LastSeq != 7 {
		t.Fatalf("status %+v", st)
	}
}

func TestEmptyBufferIsLive(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, true)
	if err := s.catchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
	if st := s.Status(); st.State != StateLive || !st.Synced || st.HasSeq {
		t.Fatalf("status %+v", st)
	}
}

func TestBadMessages(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	ctx := context.Background()
	seq24 := make([]byte, 24)
	for _, frames := range [][][]byte{
		{nil, seq24, batch()},           // snapshot extension: unsupported
		{nil, make([]byte, 4), batch()}, // short
		{nil, batch()},                  // two frames
		{nil, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil}, // END marker live
	} {
		if err := s.handle(ctx, frames); err != nil {
			t.Fatal(err)
		}
	}
	s.publish()
	st := s.Status()
	if st.UnsupportedSeq != 2 || st.BadFrames != 2 || st.HasSeq {
		t.Fatalf("status %+v", st)
	}

	// An undecodable payload consumes its sequence and invalidates the worker.
	e0, _ := stored(nil, [2]uint64{1, 100})
	sendLive(t, s, 0, batch(e0))
	sendLive(t, s, 1, []byte{0x93, 0xcb})
	st = s.Status()
	if st.State != StateStale || st.Rejected[ReasonMalformedBatch] != 1 || st.LastSeq != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestFilters(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	e0, _ := stored(nil, [2]uint64{1, 100})
	e0.medium = "TAPE" // no tier: dropped
	bad, _ := stored(nil, [2]uint64{2, 101})
	bad.bs = 2 // block size mismatch: rejected by the decoder, which is safe
	e1, _ := stored(nil, [2]uint64{3, 102})
	orphan, _ := stored(p64(999), [2]uint64{4, 103})
	sendLive(t, s, 0, batch(e0, bad, e1, orphan))
	st := s.Status()
	if st.Rejected[ReasonMedium] != 1 || st.Rejected[ReasonParentNotFound] != 1 || st.Stored != 1 || st.State != StateLive {
		t.Fatalf("status %+v", st)
	}
	if st.RejectedTotal() != 3 {
		t.Fatalf("rejected total %d, want 3", st.RejectedTotal())
	}
	// More rejected stores than the decoder records one by one are still only stores:
	// the worker stays live.
	many := make([]ev, 2*kvevents.MaxRecordedRejections)
	for i := range many {
		many[i] = bad
	}
	sendLive(t, s, 1, batch(many...))
	if st := s.Status(); st.State != StateLive || st.Invalidations != 0 {
		t.Fatalf("after %d rejected stores: %+v", len(many), st)
	}
	// A batch for another rank is skipped whole.
	m := mp{}.Arr(3).F64(1).Arr(1)
	m = e1.encode(m).Uint(3)
	sendLive(t, s, 2, m)
	if st := s.Status(); st.Rejected[ReasonRankMismatch] != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestGraceRemovesWorker(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	e0, _ := stored(nil, [2]uint64{1, 100})
	sendLive(t, s, 0, batch(e0))
	s.down(errors.New("gone"))
	if err := s.checkGrace(); err != nil {
		t.Fatal(err)
	}
	if e.Stats().Workers != 1 {
		t.Fatal("worker removed before the grace period")
	}
	clock = clock.Add(DefaultGrace)
	if err := s.checkGrace(); err != nil {
		t.Fatal(err)
	}
	s.setState()
	s.publish()
	if st := s.Status(); st.State != StateRemoved || st.Removals != 1 || st.HasSeq {
		t.Fatalf("status %+v", st)
	}
	if n := e.Stats().Workers; n != 0 {
		t.Fatalf("workers %d after grace", n)
	}
}

func TestParseReply(t *testing.T) {
	seq := []byte{0, 0, 0, 0, 0, 0, 0, 1}
	for _, tc := range []struct {
		frames [][]byte
		ok     bool
	}{
		{[][]byte{{}, seq, []byte("p")}, true},                      // vLLM < v0.26, SGLang
		{[][]byte{{}, []byte("kv-events"), seq, []byte("p")}, true}, // vLLM v0.26+
		{[][]byte{{}, {}, seq, []byte("p")}, true},                  // v0.26+ with the default topic
		{[][]byte{seq, []byte("p")}, true},                          // no delimiter
		{[][]byte{{}, seq}, false},
		{[][]byte{{}, {}, {}, seq, []byte("p")}, false},
	} {
		s, p, err := parseReply(tc.frames)
		if (err == nil) != tc.ok {
			t.Fatalf("%q: err %v", tc.frames, err)
		}
		if tc.ok && (binary.BigEndian.Uint64(s) != 1 || string(p) != "p") {
			t.Fatalf("%q: seq %x payload %q", tc.frames, s, p)
		}
	}
}

func TestConfig(t *testing.T) {
	e := newEngine(t)
	ok := Config{Endpoint: "tcp://127.0.0.1:5557", Worker: "w", Index: e}
	if _, err := New(ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no worker", func(c *Config) { c.Worker = "" }},
		{"no index", func(c *Config) { c.Index = nil }},
		{"bad scheme", func(c *Config) { c.Endpoint = "udp://x:1" }},
		{"star dial", func(c *Config) { c.Endpoint = "tcp://*:5557" }},
		{"bad replay", func(c *Config) { c.ReplayEndpoint = "tcp://h" }},
		{"block size", func(c *Config) { c.BlockSize = -1 }},
		{"backoff", func(c *Config) { c.ReconnectMin, c.ReconnectMax = time.Second, time.Millisecond }},
		{"rank", func(c *Config) { c.DPRank = -2 }},
	} {
		c := ok
		tc.mod(&c)
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", tc.name, err)
		}
	}
	bind := ok
	bind.Endpoint, bind.Bind = "tcp://127.0.0.1:0", true
	if _, err := New(bind); err != nil {
		t.Fatal(err)
	}
}

func TestEndpointsAndNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		rank int
		want string
	}{
		{"tcp://10.0.0.7:5557", 0, "tcp://10.0.0.7:5557"},
		{"tcp://10.0.0.7:5557", 3, "tcp://10.0.0.7:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"},
	} {
		got, err := OffsetEndpoint(tc.in, tc.rank)
		if err != nil || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tc.in, tc.rank, got, err, tc.want)
		}
	}
	if _, err := OffsetEndpoint("tcp://h:65535", 1); err == nil {
		t.Error("port overflow accepted")
	}
	if got := WorkerID("tcp://h:1", 0, false); got != "tcp://h:1" {
		t.Error(got)
	}
	if got := WorkerID("pod", 0, true); got != "pod#dp0" {
		t.Error(got)
	}
	if got := WorkerID("pod", 2, false); got != "pod#dp2" {
		t.Error(got)
	}
	if got := Namespace("", "lora=a"); got != "lora=a" {
		t.Error(got)
	}
	if got := Namespace("m;x%", "lora=a"); got != "model=m%3Bx%25;lora=a" {
		t.Error(got)
	}
	if Namespace("a;b", "") == Namespace("a", "b") || Namespace("a", ";b") == Namespace("a;", "b") {
		t.Error("namespace not injective")
	}
	if !strings.HasPrefix(Namespace("m", ""), "model=m;") {
		t.Error(Namespace("m", ""))
	}
	for _, s := range States() {
		if strings.HasPrefix(s.String(), "State(") {
			t.Error(s)
		}
	}
}

var _ Index = (*engine.Engine)(nil)
