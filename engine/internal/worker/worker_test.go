package worker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/internal/invariants"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEnv is an Env of two shards whose registry gives tier components the ids from 1
// on (the primary is 0).
func testEnv() *Env {
	env := &Env{Seed: table.SeedFrom(5), Chain: chain.New(false, table.SeedFrom(6)), Shards: 2}
	next := uint32(1)
	env.Register = func(p *Worker, t Tier) *Worker {
		c := p.NewComponent(t, next)
		next++
		return c
	}
	return env
}

// members replays an outbox's deltas into per-worker-id membership sets, as the shards
// would, failing on a removal of a key the worker was not a member of or an addition of
// one it was; the outbox is emptied.
type members map[uint32]map[uint64]bool

func (m members) drain(t *testing.T, env *Env, o *Outbox) {
	t.Helper()
	n := 0
	for s := range o.Pend {
		for i := range o.Pend[s] {
			d := &o.Pend[s][i]
			if env.OwnerOf(d.FP()) != s {
				t.Fatalf("delta of fingerprint %#x queued for shard %d", d.FP(), s)
			}
			set := m[d.ID()]
			if set == nil {
				set = map[uint64]bool{}
				m[d.ID()] = set
			}
			switch d.Op() {
			case shard.OpAdd:
				if set[d.FP()] {
					t.Fatalf("worker %d added twice at %#x", d.ID(), d.FP())
				}
				set[d.FP()] = true
			case shard.OpRemove:
				if !set[d.FP()] {
					t.Fatalf("worker %d removed at %#x, where it is no member", d.ID(), d.FP())
				}
				delete(set, d.FP())
			}
			n++
		}
		o.Pend[s] = o.Pend[s][:0]
	}
	if n != o.Pending {
		t.Fatalf("%d deltas pending, %d queued", o.Pending, n)
	}
	o.Pending = 0
}

// held returns the fingerprints of the keys w's own tables hold.
func held(env *Env, w *Worker) map[uint64]bool {
	out := map[uint64]bool{}
	w.keys.each(func(ref uint32) {
		if w.keys.seqs(ref) > 0 {
			out[env.fingerprint(w.keys.key(ref))] = true
		}
	})
	return out
}

// indexed returns the fingerprints of the keys w's own tables hold at the positions
// the index keeps (Env.Indexed): the memberships w's deltas must leave.
func indexed(env *Env, w *Worker) map[uint64]bool {
	out := map[uint64]bool{}
	w.keys.each(func(ref uint32) {
		if k := w.keys.key(ref); w.keys.seqs(ref) > 0 && env.Indexed(k.pos) {
			out[env.fingerprint(k)] = true
		}
	})
	return out
}

// TestWorkerHistories drives one worker through random histories of its event-side
// operations (chains stored under roots and under held parents on every tier, removals,
// copies between tiers, clears) and after each one checks its bookkeeping (Check), the
// published sizes against its seq tables, and the delta stream it queued: replayed as
// the shards would, every tier's memberships are exactly the keys its tables hold (on
// a sparse environment, seeds 5 to 8, those at the positions the index keeps).
func TestWorkerHistories(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 77))
			env := testEnv()
			env.Locked = seed > 4
			w := New("w", 0)
			o := NewOutbox(env.Shards)
			m := members{}
			var seqs []uint64 // every seq stored so far, some no longer held
			next := uint64(1)
			w.Lock()
			defer w.Unlock()
			w.SetOutbox(o)
			for step := range 600 {
				tier := Tier(0)
				if seed%2 == 0 {
					tier = Tier(r.IntN(NumTiers))
				}
				switch op := r.IntN(10); {
				case op < 5:
					var p Parent
					if len(seqs) > 0 && r.IntN(3) > 0 {
						var ok bool
						if p, ok = w.FindParent(env, tier, seqs[r.IntN(len(seqs))]); !ok {
							continue
						}
					}
					blocks := make([]Block, 1+r.IntN(int(3+seed*4)))
					for i := range blocks {
						s := next
						if len(seqs) > 0 && r.IntN(8) == 0 {
							s = seqs[r.IntN(len(seqs))] // a seq moves (last write wins)
						} else {
							next++
						}
						blocks[i] = Block{Content: uint64(r.IntN(4)), Seq: s}
					}
					switch x := r.IntN(12); {
					case x == 0 && len(blocks) > 1: // a seq twice in the event: rejected
						i := r.IntN(len(blocks) - 1)
						blocks[i+1+r.IntN(len(blocks)-1-i)].Seq = blocks[i].Seq
					case x == 1 && p.holder != nil: // the parent's seq: rejected
						blocks[r.IntN(len(blocks))].Seq = p.Seq
					}
					valid := o.ValidStore(env, p.Seq, p.holder != nil, blocks)
					before := stateOf(w)
					if got := w.Store(env, tier, 0, p, blocks); got != valid {
						t.Fatalf("step %d: Store reported %v, the duplicate check %v", step, got, valid)
					}
					if !valid {
						if o.Pending != 0 {
							t.Fatalf("step %d: a rejected store left %d deltas queued", step, o.Pending)
						}
						if after := stateOf(w); after != before {
							t.Fatalf("step %d: a rejected store changed the worker:\n%s\n%s", step, before, after)
						}
					}
					for _, b := range blocks {
						seqs = append(seqs, b.Seq)
					}
				case op < 7 && len(seqs) > 0:
					rm := make([]uint64, 1+r.IntN(4))
					for i := range rm {
						rm[i] = seqs[r.IntN(len(seqs))]
					}
					w.Remove(env, tier, rm)
				case op < 8 && len(seqs) > 0: // a stretch of stored seqs, last first: a chain's eviction
					end := 1 + r.IntN(len(seqs))
					rm := slices.Clone(seqs[max(0, end-1-r.IntN(40)):end])
					slices.Reverse(rm)
					w.Remove(env, tier, rm)
				case op < 9 && len(seqs) > 0 && tier != Device:
					w.Copy(env, tier, seqs[r.IntN(len(seqs)):][:1])
				case op == 9 && r.IntN(10) == 0:
					w.Clear(env)
				}
				w.Publish(env)
				if err := w.Check(env, true); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				m.drain(t, env, o)
				check := func(c *Worker) {
					want := indexed(env, c)
					got := m[c.ID()]
					if len(got) != len(want) {
						t.Fatalf("step %d, %s tier: %d memberships, %d keys held", step, c.Tier(), len(got), len(want))
					}
					for fp := range want {
						if !got[fp] {
							t.Fatalf("step %d, %s tier: held key %#x is no membership", step, c.Tier(), fp)
						}
					}
					if c.Size() != int64(c.Len()) {
						t.Fatalf("step %d: published size %d, %d held", step, c.Size(), c.Len())
					}
				}
				check(w)
				w.Components(func(_ Tier, c *Worker) { check(c) })
			}
		})
	}
}

// stateOf describes what w holds on every tier: each tier's size, hole count and
// digest cells, for the comparison of a worker before and after a rejected store.
func stateOf(w *Worker) string {
	var b strings.Builder
	describe := func(t Tier, c *Worker) {
		fmt.Fprintf(&b, "tier %d: %d seqs, %d holes, %d keys held;", t, c.Len(), c.holes, c.keys.held)
	}
	describe(Device, w)
	w.Components(describe)
	cells := map[string]DigestCell{}
	w.EachDigestCell(func(ns uint32, t Tier, group int, c DigestCell) {
		cells[fmt.Sprint(ns, t, group)] = c
	})
	fmt.Fprint(&b, " digest cells ", cells) // (fmt prints a map's keys sorted)
	return b.String()
}

// TestInvariantsCatchCorruption: in a -tags invariants build MustCheck panics with what
// broke once a worker's hole count is corrupted (the engine runs it after every event).
// Skipped without the tag, where the engine's calls compile away.
func TestInvariantsCatchCorruption(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants")
	}
	env := testEnv()
	w := New("w", 0)
	w.Lock()
	defer w.Unlock()
	w.SetOutbox(NewOutbox(env.Shards))
	w.Store(env, Device, 0, Parent{}, []Block{{Content: 1, Seq: 1}, {Content: 2, Seq: 2}})
	w.Publish(env)
	w.MustCheck(env, true)
	w.holes++
	msg := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		w.MustCheck(env, true)
		return ""
	}()
	if !strings.Contains(msg, "invariant broken") || !strings.Contains(msg, "holes") {
		t.Fatalf("check of a corrupted hole count: panic %q", msg)
	}
}

// TestWorkerSizeClass: a Worker is 352 bytes, a size class of the allocator, and an
// Outbox 176, as the package doc says (an invariants build adds its owner records).
func TestWorkerSizeClass(t *testing.T) {
	if invariants.Enabled {
		t.Skip("an invariants build adds owner records")
	}
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the sizes are a 64-bit platform's")
	}
	if n := unsafe.Sizeof(Worker{}); n != 352 {
		t.Fatalf("a Worker is %d bytes, want 352 (a size class: see the package doc)", n)
	}
	if n := unsafe.Sizeof(Outbox{}); n != 176 {
		t.Fatalf("an Outbox is %d bytes, want 176 (see the package doc)", n)
	}
}

// TestDrainMovesTwice: a segment of 64 blocks that removals drain one block per event,
// leaf first (as vLLM evicts), moves to a smaller chunk twice on its way to one block
// (under a quarter full: 64 -> 16 -> 4 blocks of room), and is never left under a
// quarter full past the smallest classes (keyTable.shrink).
func TestDrainMovesTwice(t *testing.T) {
	env := testEnv()
	w := New("w", 0)
	o := NewOutbox(env.Shards)
	w.Lock()
	defer w.Unlock()
	w.SetOutbox(o)
	blocks := make([]Block, 64)
	for i := range blocks {
		blocks[i] = Block{Content: uint64(i), Seq: uint64(100 + i)}
	}
	if !w.Store(env, Device, 0, Parent{}, blocks) {
		t.Fatal("store rejected")
	}
	seg := segOf(func() uint32 { r, _ := w.seqs.get(&env.Seed, 163); return r }())
	moves, class := 0, w.keys.segs[seg].class
	for i := len(blocks) - 1; i > 0; i-- {
		w.Remove(env, Device, []uint64{blocks[i].Seq})
		h := &w.keys.segs[seg]
		if h.class != class {
			moves, class = moves+1, h.class
		}
		if h.class >= 3 && int(h.n)*4 < int(segCaps[h.class]) {
			t.Fatalf("%d blocks left in a chunk of %d", h.n, segCaps[h.class])
		}
		w.Publish(env)
		if err := w.Check(env, true); err != nil {
			t.Fatal(err)
		}
	}
	if moves != 2 {
		t.Fatalf("the draining segment moved %d times, want 2", moves)
	}
}
