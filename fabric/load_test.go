package fabric

import (
	"encoding/json"
	"fmt"
	"strings"
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
	l, err := NewLoadShare(nc, tr, LoadShareConfig{Replica: name, Heartbeat: time.Hour, Silence: 2 * time.Hour, MaxPerReplica: 3, MaxReplicas: 2, Now: now})
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
		{MaxPerReplica: -1}, {MaxReplicas: 1 << 20}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
