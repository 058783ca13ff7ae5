package worker

import "fmt"

// A declared worker's KV-cache groups (the engine's groups.go has the semantics: the
// declaration, the cuts a query accepts). Their blocks live in per-group tables of the
// worker, not in the positional index, and belong like the rest of its bookkeeping to
// the holder of its mutex; queries read them under that mutex.

// Rule is one validated group of a declaration: its kind (the engine's GroupKind), its
// span (block size in index units), its window in tokens as declared (0 unless a
// sliding window) and, for a sliding window, its lookback in its own blocks,
// max(1, ceil((window-1) / block size)).
type Rule struct {
	Kind     uint8
	Span     int
	Window   int
	Lookback int
}

// GroupKey names a block's prefix in a group: its namespace, its end (the length of its
// prefix in units) and the prefix hash of its last unit.
type GroupKey struct {
	NS     uint32
	End    uint32
	Prefix uint64
}

// GroupEntry is one held block of a group's tier, as a snapshot carries it.
type GroupEntry struct {
	Seq uint64
	Key GroupKey
}

// Hybrid is a declared worker's groups, owned by the holder of the worker's mutex
// (every method). The declaration (unit, rules) is fixed at Declare.
type Hybrid struct {
	unit   int
	rules  []Rule
	cut    int // lcm of the spans: cuts are multiples of it
	groups []hybridGroup
	// n is the worker's (group, tier, seq) entries; per tier in tn.
	n  int
	tn [NumTiers]int
}

// hybridGroup is one group's blocks: per tier, seq -> key, and key -> how many seqs
// hold it. Go maps are seeded per map, so a client cannot aim keys at one bucket.
type hybridGroup struct {
	seqs [NumTiers]map[uint64]GroupKey
	held [NumTiers]map[GroupKey]int32
	// dg is the digest of each tier's entries (digest.go).
	dg [NumTiers]digests
}

// Hybrid returns w's groups, nil for a worker that declared none. Holder of w's mutex.
func (w *Worker) Hybrid() *Hybrid { return w.hyb }

// NewHybrid returns the empty groups of a declaration in unit (validated by the
// engine), for Declare; rules are the hybrid's from now on.
func NewHybrid(unit int, rules []Rule) *Hybrid {
	h := &Hybrid{unit: unit, rules: rules, cut: 1, groups: make([]hybridGroup, len(rules))}
	for _, r := range rules {
		h.cut = lcm(h.cut, r.Span)
	}
	for i := range h.groups {
		for t := range NumTiers {
			h.groups[i].seqs[t] = map[uint64]GroupKey{}
			h.groups[i].held[t] = map[GroupKey]int32{}
		}
	}
	return h
}

// Declare gives w, which has no groups (DropGroups with forget first), the groups h
// (NewHybrid, possibly filled by Put), unpublished: PublishGroups publishes what h
// holds. Holder of w's mutex.
func (w *Worker) Declare(h *Hybrid) { w.hyb = h }

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// DropGroups drops every block of w's groups and publishes the change (PublishGroups);
// with forget set, w has no groups afterwards. It reports whether w had any. Holder of
// w's mutex.
func (w *Worker) DropGroups(env *Env, forget bool) bool {
	h := w.hyb
	if h == nil {
		return false
	}
	before := h.tn
	for i := range h.groups {
		for t := range NumTiers {
			clear(h.groups[i].seqs[t])
			clear(h.groups[i].held[t])
			h.groups[i].dg[t].reset()
		}
	}
	h.n, h.tn = 0, [NumTiers]int{}
	w.PublishGroups(env, before)
	if forget {
		w.hyb = nil
	}
	return true
}

// PublishGroups adds the change of w's group entries since before (TierLens then) to
// the engine's block counts and publishes w's group size. Holder of w's mutex.
func (w *Worker) PublishGroups(env *Env, before [NumTiers]int) {
	h := w.hyb
	w.hybSize.Store(int64(h.n))
	for t := range NumTiers {
		if d := h.tn[t] - before[t]; d != 0 {
			env.addBlocks(Tier(t), int64(d))
		}
	}
}

// Unit is the declaration's unit (the index's block size in tokens).
func (h *Hybrid) Unit() int { return h.unit }

// Rules are the declaration's groups, in group order (read-only).
func (h *Hybrid) Rules() []Rule { return h.rules }

// Cut is the least common multiple of the groups' spans: every cut is a multiple of it.
func (h *Hybrid) Cut() int { return h.cut }

// Len is the number of (group, tier, seq) entries held.
func (h *Hybrid) Len() int { return h.n }

// TierLens is the number of entries held per tier.
func (h *Hybrid) TierLens() [NumTiers]int { return h.tn }

// Lookup returns the key at which group gi holds seq on tier t.
func (h *Hybrid) Lookup(gi int, t Tier, seq uint64) (GroupKey, bool) {
	k, ok := h.groups[gi].seqs[t][seq]
	return k, ok
}

// Holds reports whether group gi holds a block at key k on tier t.
func (h *Hybrid) Holds(gi int, t Tier, k GroupKey) bool { return h.groups[gi].held[t][k] > 0 }

// AppendEntries appends group gi's entries on tier t to dst, in map order.
func (h *Hybrid) AppendEntries(gi int, t Tier, dst []GroupEntry) []GroupEntry {
	for seq, k := range h.groups[gi].seqs[t] {
		dst = append(dst, GroupEntry{Seq: seq, Key: k})
	}
	return dst
}

// Put makes group gi hold seq at k on tier t (last write wins).
func (h *Hybrid) Put(gi int, t Tier, seq uint64, k GroupKey) {
	g := &h.groups[gi]
	if old, ok := g.seqs[t][seq]; ok {
		if old == k {
			return
		}
		h.unhold(g, t, old)
		g.dg[t].add(old.NS, digestTerm(seq, old.End), -1)
	} else {
		h.n++
		h.tn[t]++
	}
	g.seqs[t][seq] = k
	g.held[t][k]++
	g.dg[t].add(k.NS, digestTerm(seq, k.End), 1)
}

func (h *Hybrid) unhold(g *hybridGroup, t Tier, k GroupKey) {
	if n := g.held[t][k]; n <= 1 {
		delete(g.held[t], k)
	} else {
		g.held[t][k] = n - 1
	}
}

// Remove drops seqs from group gi's tier t and returns how many it did not hold.
func (h *Hybrid) Remove(gi int, t Tier, seqs []uint64) (skipped int) {
	g := &h.groups[gi]
	for _, s := range seqs {
		k, ok := g.seqs[t][s]
		if !ok {
			skipped++
			continue
		}
		delete(g.seqs[t], s)
		h.unhold(g, t, k)
		g.dg[t].add(k.NS, digestTerm(s, k.End), -1)
		h.n--
		h.tn[t]--
	}
	return skipped
}

// Copy makes group gi hold on tier t copies of the blocks it holds on another tier
// under seqs (the fastest other tier's); it returns how many seqs it skipped.
func (h *Hybrid) Copy(gi int, t Tier, seqs []uint64) (skipped int) {
	g := &h.groups[gi]
	for _, s := range seqs {
		found := false
		for o := Tier(0); o < NumTiers && !found; o++ {
			if k, ok := g.seqs[o][s]; ok && o != t {
				h.Put(gi, t, s, k)
				found = true
			}
		}
		if _, held := g.seqs[t][s]; !found && !held {
			skipped++
		}
	}
	return skipped
}

// checkDigest verifies a declared worker's group digests against a recount.
func (h *Hybrid) checkDigest() error {
	for gi := range h.groups {
		g := &h.groups[gi]
		for t := range g.seqs {
			d := recount(func(add func(uint32, uint64, uint32)) {
				for seq, k := range g.seqs[t] {
					add(k.NS, seq, k.End)
				}
			})
			if !d.equal(&g.dg[t]) {
				return fmt.Errorf("group %d, %s tier: digest kept and recounted differ", gi, Tier(t))
			}
		}
	}
	return nil
}
