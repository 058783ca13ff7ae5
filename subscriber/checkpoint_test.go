package subscriber

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// resumedSub returns a subscriber on e resumed at cp (Config.Resume), with a fake
// publisher, connected.
func resumedSub(t *testing.T, e *engine.Engine, fp *fakePub, cp Checkpoint) *Subscriber {
	t.Helper()
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:2", Worker: "w", Model: "m",
		Index: e, BlockSize: testBS, Resume: &cp})
	if err != nil {
		t.Fatal(err)
	}
	s.replay = fp.replay
	s.up()
	return s
}

// TestCheckpointAt: every event a subscriber applies leaves its checkpoint in the
// index (the batch's sequence and digest, exactness, the event's cursor); a made-up
// clear leaves none, and an inexact worker's events say so.
func TestCheckpointAt(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	if _, ok := CheckpointAt(e.Positions()["w"]); ok {
		t.Fatal("checkpoint before any batch")
	}
	e0, _ := stored(nil, [2]uint64{1, 100})
	e1, _ := stored(p64(100), [2]uint64{2, 101})
	b0 := batch(e0, e1)
	sendLive(t, s, 0, b0)
	cp, ok := CheckpointAt(e.Positions()["w"])
	if want := (Checkpoint{Seq: 0, Digest: Mark(xxh3.Hash(b0), true), Exact: true, Cursor: SourceCursor(0, 1)}); !ok || cp != want {
		t.Fatalf("checkpoint %+v (ok %v), want %+v", cp, ok, want)
	}
	if err := s.invalidate(); err != nil {
		t.Fatal(err)
	}
	if cp, ok := CheckpointAt(e.Positions()["w"]); ok {
		t.Fatalf("checkpoint %+v after a made-up clear", cp)
	}
	e2, _ := stored(nil, [2]uint64{3, 102})
	sendLive(t, s, 1, batch(e2))
	if cp, ok := CheckpointAt(e.Positions()["w"]); !ok || cp.Exact || cp.Seq != 1 {
		t.Fatalf("checkpoint %+v (ok %v) of a stale worker", cp, ok)
	}
	// A clear from the publisher makes the index exact again, and says so.
	sendLive(t, s, 2, batch(ev{kind: "cleared"}))
	if cp, ok := CheckpointAt(e.Positions()["w"]); !ok || !cp.Exact || cp.Seq != 2 {
		t.Fatalf("checkpoint %+v (ok %v) after the publisher's clear", cp, ok)
	}
}

// TestCheckpointCutUnderLoad: snapshots written while a subscriber applies batch after
// batch (three events each) all hold the worker's checkpoint with its blocks, wherever
// the cut falls, even inside a batch. A subscriber resumed from any of them on the
// restored index (what a kill -9 and a restart from the last snapshot do) verifies the
// batch, applies the rest of it and what followed, and answers as the reference model of
// the whole history: nothing lost, nothing applied twice (an event applied twice would
// be rejected: its parent is gone by then). Before, the checkpoint was kept only if no
// batch landed during the whole write, and a busy worker had none.
func TestCheckpointCutUnderLoad(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	s := newTestSub(t, e, fp, true)
	// Besides the snapshots written concurrently, one is cut inside every 16th batch,
	// after its first or second event, by the index the subscriber applies to.
	cuts := &cuttingIndex{e: e}
	s.cfg.Index = cuts
	m := refmodel.New()
	const n = 400
	var queries [][]uint64
	var batches [][]byte
	for k := uint64(0); k < n; k++ {
		// A chain link; a root whose parent, the previous batch's root, this batch
		// removes after it (re-applied, the store would be rejected); a removal.
		link, linkRef := stored(nil, [2]uint64{k % 5, 1000 + k})
		if k > 0 {
			link, linkRef = stored(p64(1000+k-1), [2]uint64{k % 5, 1000 + k})
		}
		child, childRef := stored(nil, [2]uint64{50 + k%3, 5000 + k})
		if k > 0 {
			child, childRef = stored(p64(5000+k-1), [2]uint64{50 + k%3, 5000 + k})
		}
		events := []ev{link, child}
		_ = m.Stored("w", 1000+k-1, k > 0, linkRef)
		_ = m.Stored("w", 5000+k-1, k > 0, childRef)
		if k > 0 {
			events = append(events, ev{kind: "removed", seqs: []uint64{5000 + k - 1}})
			m.Removed("w", []uint64{5000 + k - 1})
		}
		b := batch(events...)
		batches = append(batches, b)
		fp.add(k, b)
		var chain []uint64
		for j := uint64(0); j <= k; j++ {
			chain = append(chain, j%5)
		}
		if k%37 == 0 {
			queries = append(queries, contents(chain...), contents(50+k%3))
		}
	}
	done := make(chan error, 1)
	go func() {
		var sb [8]byte
		for k, b := range batches {
			sb = [8]byte{7: byte(k), 6: byte(k >> 8)}
			if err := s.handle(context.Background(), [][]byte{nil, sb[:], b}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var snaps [][]byte
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
		}
		var b bytes.Buffer
		if err := e.WriteSnapshot(&b); err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, b.Bytes())
	}
	snaps = append(snaps, cuts.snaps...)
	mid := 0
	for i, snap := range snaps {
		r, err := engine.RestoreBytes(engine.Config{Shards: 2, JumpSize: 4}, snap)
		if err != nil {
			t.Fatal(err)
		}
		pos, known := r.Positions()["w"]
		cp, ok := CheckpointAt(pos)
		switch {
		case !known:
			r.Close()
			continue // before the first batch
		case !ok || !cp.Exact:
			t.Fatalf("snapshot %d: position %+v holds no exact checkpoint", i, pos)
		}
		if cp.Cursor&(1<<24-1) < 2 && cp.Seq > 0 {
			mid++
		}
		rs := resumedSub(t, r, fp, cp)
		if err := rs.catchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := rs.local
		if st.Restarts != 0 || st.Invalidations != 0 || st.Rejected != (s.local.Rejected) || rs.last != n-1 {
			t.Fatalf("snapshot %d at %+v: resumed to %d with %+v", i, cp, rs.last, st)
		}
		sameAnswers(t, r, Namespace("m", ""), m, queries)
		r.Close()
	}
	t.Logf("%d snapshots, %d of them cut inside a batch", len(snaps), mid)
	if mid < n/16 {
		t.Fatalf("only %d snapshots cut inside a batch", mid)
	}
}

// cuttingIndex applies to e and writes a snapshot of it right after the first or second
// event of every 16th batch.
type cuttingIndex struct {
	e     *engine.Engine
	snaps [][]byte
}

func (c *cuttingIndex) Apply(ev *engine.Event) error {
	err := c.e.Apply(ev)
	if seq, idx := ev.Cursor>>24-1, ev.Cursor&(1<<24-1); ev.Cursor != 0 && seq%16 == 15 && idx == seq/16%2 {
		var b bytes.Buffer
		if werr := c.e.WriteSnapshot(&b); werr != nil {
			return werr
		}
		c.snaps = append(c.snaps, b.Bytes())
	}
	return err
}

// TestResumeOtherBatchRestarts: a checkpoint whose digest does not match the batch the
// engine buffers at its sequence is another engine's history: the worker is reset.
func TestResumeOtherBatchRestarts(t *testing.T) {
	e := newEngine(t)
	fp := &fakePub{}
	e0, _ := stored(nil, [2]uint64{1, 100})
	e1, _ := stored(p64(100), [2]uint64{2, 101})
	fp.add(0, batch(e0))
	fp.add(1, batch(e1))
	for _, tc := range []struct {
		digest   uint64
		restarts uint64
	}{{Mark(xxh3.Hash(batch(e0)), true), 0}, {Mark(xxh3.Hash(batch(e0))+2, true), 1}} {
		t.Run(fmt.Sprint(tc.restarts), func(t *testing.T) {
			r := resumedSub(t, e, fp, Checkpoint{Seq: 0, Digest: tc.digest, Exact: true})
			r.synced = true
			if err := r.catchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.setState()
			r.publish()
			if st := r.Status(); st.LastSeq != 1 || st.Restarts != tc.restarts || st.State != StateLive {
				t.Fatalf("resumed: %+v", st)
			}
		})
	}
}
