package fabric

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/route"
)

// waitFor polls cond until it holds, failing after 10 s (a bounded poll of a
// condition another goroutine makes true).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond) // bounded poll of a condition
	}
}

func newShare(t *testing.T, nc *nats.Conn, name string, now func() time.Time) (*LoadShare, *route.Tracker[string]) {
	t.Helper()
	tr, err := route.NewTracker[string](route.TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoadShare(nc, tr, LoadShareConfig{Replica: name, Heartbeat: time.Hour, Silence: 2 * time.Hour, TTL: 4 * time.Hour, MaxPerReplica: 3, MaxReplicas: 2, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l, tr
}

// TestLoadShareFolds: what replica a routes shows in replica b's tracker under a key of
// its own, its first token and finish take it out again, and a replica silent past
// Silence has its requests dropped.
func TestLoadShareFolds(t *testing.T) {
	ns := startNATS(t)
	var clock time.Time
	now := func() time.Time { return clock }
	a, ta := newShare(t, ns.connect(t), "a", now)
	b, tb := newShare(t, ns.connect(t), "b", now)
	req := route.Request{Tokens: 640, BlockSize: 64, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
	if err := ta.Routed("r1", "w1", req, 128); err != nil {
		t.Fatal(err)
	}
	a.Routed("r1", "w1", req, 128)
	waitFor(t, "b folds a's routed", func() bool { return b.Stats().InFlight == 1 })
	if got, want := tb.Load("w1"), ta.Load("w1"); got != want {
		t.Fatalf("b sees %+v of w1, a %+v", got, want)
	}
	a.FirstToken("r1")
	waitFor(t, "b folds a's first token", func() bool { return tb.Load("w1").Prefilling == 0 })
	if l := tb.Load("w1"); l.PrefillTokens != 0 || l.UncachedTokens != 512 || l.ActiveBlocks != 10 {
		t.Fatalf("after the first token: %+v", l)
	}
	a.Finished("r1")
	waitFor(t, "b folds a's finish", func() bool { return b.Stats().InFlight == 0 })
	if l := tb.Load("w1"); l != (route.Load{}) {
		t.Fatalf("after the finish: %+v", l)
	}
	// Silence: a routes, then says nothing for longer than Silence.
	a.Routed("r2", "w2", req, 0)
	waitFor(t, "b folds r2", func() bool { return b.Stats().InFlight == 1 })
	b.sweep(clock.Add(time.Hour)) // not yet silent
	if tb.InFlight() != 1 {
		t.Fatal("dropped before the silence")
	}
	b.sweep(clock.Add(3 * time.Hour))
	if st := b.Stats(); tb.InFlight() != 0 || st.Expired != 1 || st.Replicas != 0 {
		t.Fatalf("after a's silence: %d in flight, %+v", tb.InFlight(), st)
	}
	if st := a.Stats(); st.Published < 5 || st.InFlight != 0 || ta.InFlight() != 1 {
		t.Fatalf("a: %+v, %d in flight (it folds only b's heartbeat, which is no request)", st, ta.InFlight())
	}
}

// TestLoadShareHostilePeer: a peer of our own publishes garbage, over-long names, too
// many requests and too many replica ids; the LoadShare refuses and counts each, and
// holds no more than its bounds.
func TestLoadShareHostilePeer(t *testing.T) {
	ns := startNATS(t)
	var clock time.Time
	b, tb := newShare(t, ns.connect(t), "b", func() time.Time { return clock })
	peer := ns.connect(t)
	send := func(v any) {
		data, ok := v.([]byte)
		if !ok {
			var err error
			if data, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := peer.Publish(DefaultLoadSubject, data); err != nil {
			t.Fatal(err)
		}
	}
	routed := func(replica, id string) loadDelta {
		return loadDelta{Replica: replica, Kind: deltaRouted, ID: id, Worker: "w", Tokens: 10, BlockSize: 4}
	}
	bad := []any{
		[]byte("{"), []byte(`{"r":"x","k":"routed","id":"1","w":"w","t":10,"b":4,"h":[1,-2]}`),
		loadDelta{Replica: "x", Kind: "steal"},
		loadDelta{Replica: "x", Kind: deltaRouted, ID: "1", Worker: "w", Tokens: -1, BlockSize: 4},
		loadDelta{Replica: "x", Kind: deltaRouted, ID: "1", Worker: "w", Tokens: 1, BlockSize: 0},
		loadDelta{Replica: "x", Kind: deltaRouted, ID: "1", Worker: "w", Tokens: MaxShareTokens + 1, BlockSize: 4},
		loadDelta{Replica: "x", Kind: deltaRouted, ID: "1", Worker: "w", Tokens: 1, BlockSize: hash.MaxBlockSize + 1},
		loadDelta{Replica: "x", Kind: deltaRouted, ID: "1", Worker: "w", Tokens: 1, BlockSize: 4, Blocks: make([]uint64, MaxShareBlocks+1)},
		routed(strings.Repeat("x", MaxLoadName+1), "1"), routed("x", strings.Repeat("i", MaxLoadName+1)),
		loadDelta{Replica: "x", Kind: deltaFinished},
	}
	for _, v := range bad {
		send(v)
	}
	for i := range 5 { // MaxPerReplica 3: two refused
		send(routed("x", fmt.Sprint(i)))
	}
	send(routed("y", "1"))
	send(routed("z", "1")) // MaxReplicas 2: refused
	refused := uint64(len(bad) + 2 + 1)
	waitFor(t, "every delta handled", func() bool { st := b.Stats(); return st.Refused+st.Folded == refused+4 })
	if st := b.Stats(); st.Refused != refused || st.InFlight != 4 || st.Replicas != 2 || tb.InFlight() != 4 {
		t.Fatalf("stats %+v, tracker %d in flight; want %d refused, 4 in flight from 2 replicas", st, tb.InFlight(), refused)
	}
}

// TestLoadShareLossyPeer: a peer of our own that keeps heartbeating but never sends a
// finish (its requests dropped by its own TTL, or their finishes lost on core NATS)
// routes 7,000 requests, more than its MaxPerReplica of 6,500, over 1,390 s of a test
// clock. Each request stops counting DefaultShareTTL after it was folded, so none is
// refused and what the replica holds stays at the requests of the last TTL (3,000), in
// the LoadShare and in its tracker alike. (The bound is the test's own, a tenth of the
// default: the default needs ten times the deltas for the same check.)
func TestLoadShareLossyPeer(t *testing.T) {
	const (
		batches = 140
		batch   = 50
		step    = 10 * time.Second // the test clock's advance between batches
		bound   = 6500             // under batches*batch, over the TTL's worth
	)
	ns := startNATS(t)
	var clock atomic.Int64 // nanoseconds since start
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	tr, err := route.NewTracker[string](route.TrackerConfig{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	// The heartbeat ticker is long and the peer beats at every step, so silence
	// never drops the peer: only the TTL can.
	b, err := NewLoadShare(ns.connect(t), tr, LoadShareConfig{Replica: "b", Heartbeat: 20 * time.Second, Silence: 30 * time.Second,
		MaxPerReplica: bound, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	peer := ns.connect(t)
	send := func(d loadDelta) {
		data, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := peer.Publish(DefaultLoadSubject, data); err != nil {
			t.Fatal(err)
		}
	}
	sent := uint64(0)
	for i := range batches {
		clock.Store(int64(i) * int64(step))
		send(loadDelta{Replica: "x", Kind: deltaBeat})
		for j := range batch {
			n := uint64(i*batch + j)
			send(loadDelta{Replica: "x", Kind: deltaRouted, ID: fmt.Sprint(n), Worker: fmt.Sprint("w", n%8), Tokens: 128,
				BlockSize: 64, Blocks: []uint64{n % 97, n}})
		}
		sent += 1 + batch
		// The clock moves only once the batch is folded, so each delta is folded at
		// its batch's time.
		waitFor(t, fmt.Sprint("batch ", i, " handled"), func() bool { st := b.Stats(); return st.Folded+st.Refused == sent })
	}
	// Batch i was folded at i*step; at the last batch's time the batches folded less
	// than the TTL before it, ceil(TTL/step) of them, are still in flight.
	live := batch * int((DefaultShareTTL+step-1)/step)
	if live >= bound || batches*batch <= bound {
		t.Fatalf("the bound %d must lie between the TTL's %d requests and the %d sent", bound, live, batches*batch)
	}
	st := b.Stats()
	if st.Refused != 0 || st.InFlight != live || st.Expired != uint64(batches*batch-live) || tr.InFlight() != live {
		t.Fatalf("stats %+v, tracker %d in flight; want nothing refused, %d in flight in both, %d expired",
			st, tr.InFlight(), live, batches*batch-live)
	}
}

// TestLoadShareQueueBounded: a peer that keeps one request in flight and routes and
// finishes 20,000 others within the TTL leaves the folding queue bounded (its
// finished entries compacted away), and the long-running request still expires at
// its TTL.
func TestLoadShareQueueBounded(t *testing.T) {
	var clock time.Time
	now := func() time.Time { return clock }
	tr, err := route.NewTracker[string](route.TrackerConfig{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadShareConfig{Replica: "b", MaxPerReplica: 3, TTL: time.Minute, Now: now}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	l := &LoadShare{sink: tr, cfg: cfg, remote: map[string]*remoteReplica{}}
	fold := func(kind, id string) {
		t.Helper()
		if err := l.foldLocked(loadDelta{Replica: "x", Kind: kind, ID: id, Worker: "w", Tokens: 8, BlockSize: 4}, clock); err != nil {
			t.Fatal(err)
		}
	}
	fold(deltaRouted, "long")
	most := 0
	for i := range 20_000 {
		fold(deltaRouted, fmt.Sprint(i))
		fold(deltaFinished, fmt.Sprint(i))
		most = max(most, len(l.remote["x"].folded))
	}
	if bound := 2*cfg.MaxPerReplica + 1; most > bound {
		t.Fatalf("folding queue reached %d entries, want at most %d", most, bound)
	}
	clock = clock.Add(time.Minute)
	fold(deltaBeat, "")
	if r := l.remote["x"]; len(r.ids) != 0 || tr.InFlight() != 0 || l.st.Expired != 1 {
		t.Fatalf("past the TTL: %d in flight, tracker %d, %d expired", len(r.ids), tr.InFlight(), l.st.Expired)
	}
}

// FuzzLoadDelta: any bytes decode to an error or to a delta within the bounds.
func FuzzLoadDelta(f *testing.F) {
	f.Add([]byte(`{"r":"a","k":"routed","id":"1","w":"w","t":640,"c":64,"b":64,"h":[1,2,3]}`))
	f.Add([]byte(`{"r":"a","k":"beat"}`))
	f.Add([]byte(`{"r":"a","k":"done","id":"1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeDelta(data)
		if err != nil {
			return
		}
		if d.Replica == "" || len(d.Replica) > MaxLoadName || len(d.ID) > MaxLoadName || len(d.Worker) > MaxLoadName ||
			len(d.Blocks) > MaxShareBlocks || d.Kind == deltaRouted && (d.BlockSize < 1 || d.BlockSize > hash.MaxBlockSize ||
			d.Tokens < 0 || d.Tokens > MaxShareTokens || d.Cached < 0) {
			t.Fatalf("accepted out of bounds: %+v", d)
		}
	})
}

func TestLoadShareConfig(t *testing.T) {
	for _, c := range []LoadShareConfig{{Replica: strings.Repeat("r", MaxLoadName+1)}, {Heartbeat: time.Second, Silence: time.Second},
		{MaxPerReplica: -1}, {MaxReplicas: 1 << 20}, {TTL: -time.Second}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
