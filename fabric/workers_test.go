package fabric

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// TestReplicaWorkers: a replica lists every worker of the stream with its model, its
// last sequence and its events by kind as the reference model accepted them; a worker
// whose last event removed it is Gone; Pending is 0 once the replica has caught up. A
// replica restored from the snapshot (version 3, or version 2 without the workers'
// models) lists the same workers at the same sequences.
func TestReplicaWorkers(t *testing.T) {
	ctx, _, nc, h, sc, p := memoryStream(t, 31, 800)
	if _, err := PublishOps(ctx, p, testModel, h.ops); err != nil {
		t.Fatal(err)
	}
	// A second model's worker, removed at the end (its relay's grace period passed).
	other := []oplog.Op{
		{Kind: oplog.Stored, Worker: "other-0", Blocks: [][2]uint64{{1, 1}, {2, 2}}},
		{Kind: oplog.RemoveWorker, Worker: "other-0"},
	}
	if _, err := PublishOps(ctx, p, "other", other); err != nil {
		t.Fatal(err)
	}
	want := map[string]*ReplicaWorker{"other-0": {Worker: "other-0", Model: "other", Seq: 2, Stored: 1, Gone: true}}
	m := refmodel.New()
	for i := range h.ops {
		op := &h.ops[i]
		w := want[op.Worker]
		if w == nil {
			w = &ReplicaWorker{Worker: op.Worker, Model: testModel}
			want[op.Worker] = w
		}
		w.Seq++
		err := m.Apply(op)
		switch {
		case err != nil:
			w.Rejected++
		case op.Kind == oplog.Stored:
			w.Stored++
		case op.Kind == oplog.Removed:
			w.Removed++
		case op.Kind == oplog.Cleared:
			w.Cleared++
		case op.Kind == oplog.Copied:
			w.Copied++
		}
		if err == nil {
			w.Gone = op.Kind == oplog.RemoveWorker
		}
	}
	last := streamLast(t, ctx, nc, DefaultStream)
	start := time.Now()
	r := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: []string{testModel, "other"}}, "")
	waitApplied(t, ctx, r, last)
	got := r.Workers()
	if len(got) != len(want) {
		t.Fatalf("%d workers listed, want %d: %+v", len(got), len(want), got)
	}
	for i := range got {
		g := got[i]
		w := want[g.Worker]
		if w == nil {
			t.Fatalf("unknown worker %+v", g)
		}
		if i > 0 && got[i-1].Worker >= g.Worker {
			t.Fatalf("workers not sorted: %q before %q", got[i-1].Worker, g.Worker)
		}
		if g.LastAt.Before(start) || g.Lag < 0 {
			t.Errorf("%s: applied at %v (test started %v), lag %v", g.Worker, g.LastAt, start, g.Lag)
		}
		g.LastAt, g.Lag = time.Time{}, 0
		if g != *w {
			t.Errorf("worker %s:\n got  %+v\n want %+v", g.Worker, g, *w)
		}
	}
	if st := r.Stats(); st.Pending != 0 || st.LastAt.Before(start) || st.Lag < 0 {
		t.Fatalf("caught up: %+v, want nothing pending", st)
	}

	snap := filepath.Join(t.TempDir(), "r.snap")
	if err := r.Snapshot(snap); err != nil {
		t.Fatal(err)
	}
	check := func(name string, r *Replica, models, gone bool) {
		t.Helper()
		got := r.Workers()
		if len(got) != len(want) {
			t.Fatalf("%s: %d workers listed, want %d", name, len(got), len(want))
		}
		for _, g := range got {
			w := want[g.Worker]
			if w == nil {
				t.Fatalf("%s: unknown worker %+v", name, g)
			}
			wm := ""
			if models {
				wm = w.Model
			}
			if g != (ReplicaWorker{Worker: w.Worker, Model: wm, Seq: w.Seq, Gone: gone && w.Gone}) {
				t.Errorf("%s: %+v, want %s of model %q at %d", name, g, g.Worker, wm, w.Seq)
			}
		}
	}
	r4 := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: []string{testModel, "other"}}, snap)
	if st := r4.Stats(); !st.Restored {
		t.Fatalf("version 4 snapshot refused: %v", st.SnapshotErr)
	}
	check("version 4", r4, true, true)

	r.mu.Lock()
	v3, err := encodeSnapshotAs(&snapshot{eng: r.eng, last: r.stats.LastApplied, created: r.created, workers: r.workerSeq, workerModels: models(r), models: modelSet(r.cfg.Models)}, 3)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	snap3 := filepath.Join(t.TempDir(), "v3.snap")
	if err := os.WriteFile(snap3, v3, 0o644); err != nil {
		t.Fatal(err)
	}
	r3 := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: []string{testModel, "other"}}, snap3)
	if st := r3.Stats(); !st.Restored {
		t.Fatalf("version 3 snapshot refused: %v", st.SnapshotErr)
	}
	check("version 3", r3, true, false)

	r.mu.Lock()
	v2, err := encodeSnapshotAs(&snapshot{eng: r.eng, last: r.stats.LastApplied, created: r.created, workers: r.workerSeq, models: modelSet(r.cfg.Models)}, 2)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	snap2 := filepath.Join(t.TempDir(), "v2.snap")
	if err := os.WriteFile(snap2, v2, 0o644); err != nil {
		t.Fatal(err)
	}
	r2 := newReplica(t, ctx, nc, ReplicaConfig{Stream: sc, Models: []string{testModel, "other"}}, snap2)
	if st := r2.Stats(); !st.Restored {
		t.Fatalf("version 2 snapshot refused: %v", st.SnapshotErr)
	}
	check("version 2", r2, false, false)
}

// models returns each worker's model as r knows it. r.mu is held.
func models(r *Replica) map[string]string {
	out := map[string]string{}
	for name, w := range r.workers {
		out[name] = w.Model
	}
	return out
}
