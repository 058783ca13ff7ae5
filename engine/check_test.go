package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/internal/testsize"
)

// TestWorkerTablesCheck applies random histories (chains stored, extended and branched,
// tails and middles removed, removed blocks stored again, seqs moved, workers cleared and
// removed; with and without host and disk events) and checks every worker's bookkeeping
// after every event: the key index holds exactly the records their parents do not link
// (roots, ghosts, children of branch points; every record of a worker with tiers), and
// counts, holes, ghosts and both tables' Robin Hood order agree with a recount. A
// -tags invariants build runs the same checks inside the engine after every event of
// every test.
func TestWorkerTablesCheck(t *testing.T) {
	for _, tiers := range []bool{false, true} {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("tiers=%v/seed=%d", tiers, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 21))
				// Long chains (seeds 5, 6) grow tables past worker.TableFloor and shrink them
				// again: compact drops dead blocks and renumbers the segments.
				opt := refmodel.RandomOptions{Alphabet: int(1 + seed%4), MaxChain: []int{40, 300}[seed/5], Tiers: tiers}
				// Under -tags invariants (make test) the engine runs the same checks after
				// every event itself: a third of the history there.
				ops := refmodel.RandomOps(r, testsize.Sized(1500, 1500, 500), opt)
				e, err := New(Config{LockedIndex: true})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				for i := range ops {
					if ops[i].Kind == oplog.Query {
						continue
					}
					ev := checkEvent(&ops[i])
					if err := e.Apply(&ev); err != nil && !IsRejection(err) {
						t.Fatal(err)
					}
					ws := e.workers()
					for j := range ws {
						if w := ws[j].Load(); w != nil && !w.IsComponent() {
							e.lockWorker(w)
							err := w.Check(&e.env, true)
							e.unlockWorker(w)
							if err != nil {
								t.Fatalf("op %d (%v): %v", i, ops[i].Kind, err)
							}
						}
					}
				}
			})
		}
	}
}

// checkEvent is the engine event of a non-query op, tier included.
func checkEvent(op *oplog.Op) Event {
	ev := ceilingEvent(op)
	ev.Tier = Tier(op.Tier)
	if op.Kind == oplog.Copied {
		ev.Kind = EventCopied
	}
	return ev
}

// TestWorkerTablesCompact grows a worker's tables past worker.TableFloor (two 400-block chains
// sharing 100 blocks, holes cut into both) and removes nine blocks in ten, so that
// compact drops the dead blocks (each held block keeps its parent as a ghost, the eight
// before that are dead), splits the segments and renumbers them, checking the worker
// after every event, on a single-tier worker and on one with a host tier.
func TestWorkerTablesCompact(t *testing.T) {
	for _, tiers := range []bool{false, true} {
		t.Run(fmt.Sprintf("tiers=%v", tiers), func(t *testing.T) {
			e, err := New(Config{LockedIndex: true})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			apply := func(ev Event) {
				t.Helper()
				if err := e.Apply(&ev); err != nil {
					t.Fatal(err)
				}
				if invariants.Enabled {
					return // the engine has just run the same check itself
				}
				w := e.lookup("w")
				e.lockWorker(w)
				defer e.unlockWorker(w)
				if err := w.Check(&e.env, true); err != nil {
					t.Fatal(err)
				}
			}
			a, b := make([]Block, 400), make([]Block, 300)
			for i := range a {
				a[i] = Block{Content: uint64(i + 1), Seq: uint64(i + 1)}
			}
			for i := range b {
				b[i] = Block{Content: uint64(10_000 + i), Seq: uint64(10_000 + i)}
			}
			apply(Event{Kind: EventStored, Worker: "w", Blocks: a})
			apply(Event{Kind: EventStored, Worker: "w", Parent: 100, HasParent: true, Blocks: b})
			if tiers {
				apply(Event{Kind: EventCopied, Worker: "w", Tier: TierHost, Seqs: []uint64{1, 2, 3, 200, 10_005}})
			}
			for _, s := range []uint64{50, 150, 10_050} {
				apply(Event{Kind: EventRemoved, Worker: "w", Seqs: []uint64{s}})
			}
			if n := e.lookup("w").Footprint().Slab; n < 600 {
				t.Fatalf("%d records, want the tables grown", n)
			}
			for i := range a {
				if i%10 != 0 {
					apply(Event{Kind: EventRemoved, Worker: "w", Seqs: []uint64{a[i].Seq}})
				}
			}
			for i := range b {
				if i%10 != 0 {
					apply(Event{Kind: EventRemoved, Worker: "w", Seqs: []uint64{b[i].Seq}})
				}
			}
			fp := e.lookup("w").Footprint()
			if fp.Slab > 4*fp.Records+worker.TableFloor {
				t.Fatalf("%d blocks in an arena of %d: never compacted", fp.Records, fp.Slab)
			}
			// 69 held blocks and their 69 ghost parents stay; the 550-odd dead blocks
			// between them go.
			if held := int(e.lookup("w").Size()); fp.Records > 3*held {
				t.Fatalf("%d blocks kept for %d held: the dead ones were not dropped", fp.Records, held)
			}
		})
	}
}
