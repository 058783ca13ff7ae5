package fabric

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/namespace"
)

// TestFigures measures the figures of RESULTS.md. It runs only on demand:
//
//	KVINDEX_FIGURES=1000000 go test -run TestFigures -v -timeout 30m ./fabric/
//
// (the value is the number of (worker, block) memberships the snapshot holds;
// KVINDEX_CATCHUP=N sets the events of the catch-up measurement, default 200000). Each
// measurement checks what it measured: the restored engine holds every block the
// snapshot's did, and the caught-up replica every block published, none skipped.
func TestFigures(t *testing.T) {
	target, _ := strconv.Atoi(os.Getenv("KVINDEX_FIGURES"))
	if target <= 0 {
		t.Skip("set KVINDEX_FIGURES=<memberships> to measure")
	}
	t.Run("snapshot", func(t *testing.T) { figureSnapshot(t, target) })
	t.Run("catchup", func(t *testing.T) {
		n, _ := strconv.Atoi(os.Getenv("KVINDEX_CATCHUP"))
		if n <= 0 {
			n = 200000
		}
		figureCatchUp(t, n)
	})
}

// chainEvent returns worker w's i-th store: a 16-block chain under the worker's
// previous one (chains restart every 64 events, 1024 blocks deep), content shared by
// workers w, w+50, w+100, ...
func chainEvent(w, i int, parent uint64) engine.Event {
	ev := engine.Event{Kind: engine.EventStored, Worker: fmt.Sprintf("worker-%04d", w),
		Parent: parent, HasParent: parent != 0}
	for j := 0; j < 16; j++ {
		ev.Blocks = append(ev.Blocks, engine.Block{
			// 50 document families per chain slot: some sharing between workers.
			Content: uint64(((i/64)*50+w%50)*100000 + (i%64)*16 + j + 1),
			Seq:     uint64(w)<<40 | uint64(i*16+j+1),
		})
	}
	return ev
}

func figureSnapshot(t *testing.T, target int) {
	e, err := engine.New(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const workers = 1000
	perWorker := target / workers / 16 // events per worker; chains restart every 64 events
	start := time.Now()
	for w := 0; w < workers; w++ {
		var parent uint64
		for i := 0; i < perWorker; i++ {
			if i%64 == 0 {
				parent = 0
			}
			ev := chainEvent(w, i, parent)
			ev.Cursor = uint64(i + 1)
			if err := e.Apply(&ev); err != nil {
				t.Fatal(err)
			}
			parent = ev.Blocks[15].Seq
		}
	}
	if err := e.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	t.Logf("built %d memberships (%d workers; the index keeps %d of them, %d keys) in %v", st.Blocks, st.Workers, st.Memberships, st.IndexEntries, time.Since(start))
	path := filepath.Join(t.TempDir(), "r.snap")
	start = time.Now()
	if err := writeSnapshot(path, &snapshot{eng: e, last: uint64(perWorker), created: time.Unix(1, 0), workers: map[string]workerState{}}); err != nil {
		t.Fatal(err)
	}
	wt := time.Since(start)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	s, err := readSnapshot(path, engine.Config{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.eng.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	rt := time.Since(start)
	if got := s.eng.Stats(); got.Memberships != st.Memberships || got.Blocks != st.Blocks {
		t.Fatalf("restored %d memberships (%d in the index), want %d (%d)", got.Blocks, got.Memberships, st.Blocks, st.Memberships)
	}
	s.eng.Close()
	t.Logf("FIGURE memberships=%d snapshot_bytes=%d bytes_per_membership=%.1f write=%v restore=%v",
		st.Blocks, fi.Size(), float64(fi.Size())/float64(st.Blocks), wt.Round(time.Millisecond), rt.Round(time.Millisecond))
}

func figureCatchUp(t *testing.T, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ns := startNATS(t)
	nc := ns.connect(t)
	sc := StreamConfig{}.withDefaults() // file storage, as in production
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, js, sc); err != nil {
		t.Fatal(err)
	}
	const workers = 100
	parents := make([]uint64, workers)
	start := time.Now()
	var buf []byte
	for i := 0; i < n; i++ {
		w := i % workers
		k := i / workers
		if k%64 == 0 {
			parents[w] = 0
		}
		ev := chainEvent(w, k, parents[w])
		ev.Namespace = namespace.Of("m", "") // the subject's model's: a replica skips any other
		parents[w] = ev.Blocks[15].Seq
		buf = AppendMessage(buf[:0], &Message{WorkerSeq: uint64(k + 1), Event: ev})
		if _, err := js.PublishAsync(Subject(sc.SubjectPrefix, "m", ev.Worker), append([]byte(nil), buf...),
			jetstream.WithMsgID(MsgID(ev.Worker, uint64(k+1)))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing timed out")
	}
	pt := time.Since(start)
	last := streamLast(t, ctx, nc, sc.Name)
	start = time.Now()
	r := newReplica(t, ctx, ns.connect(t), ReplicaConfig{Stream: sc}, "")
	waitApplied(t, ctx, r, last)
	ct := time.Since(start)
	st := r.Engine().Stats()
	if rs := r.Stats(); st.Blocks != int64(16*n) || rs.Applied != uint64(n) {
		t.Fatalf("caught up %d blocks by %d events applied (%d foreign, %d rejected), want %d by %d",
			st.Blocks, rs.Applied, rs.Foreign, rs.Rejected, 16*n, n)
	}
	t.Logf("FIGURE catchup events=%d (16 blocks each, %d bytes encoded) publish=%v (%.0f ev/s, async) catch-up=%v (%.0f ev/s, %.0f blocks/s), memberships=%d blocks=%d",
		last, len(buf), pt.Round(time.Millisecond), float64(n)/pt.Seconds(), ct.Round(time.Millisecond),
		float64(last)/ct.Seconds(), float64(last*16)/ct.Seconds(), st.Memberships, st.Blocks)
}
