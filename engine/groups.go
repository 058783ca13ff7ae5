package engine

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
)

// Hybrid models: KV-cache groups.
//
// A hybrid model (gpt-oss, Gemma 3, Qwen3-Next, Jamba: sliding-window or Mamba layers
// beside full attention) keeps one KV cache per group, and vLLM reuses a cached prefix
// only up to a cut every group accepts (SPEC's "Hybrid models"; vLLM v1's
// HybridKVCacheCoordinator). A worker declares its groups with an EventGroups event;
// its stored, removed and copied events then name a group (Event.Group), and a block of
// a group whose block size spans several index units carries that many content hashes
// (Event.Contents).
//
// Who owns what: a declared worker's groups (w.hyb) belong to the holder of its mutex,
// like the rest of its bookkeeping; queries read them under that mutex (hybridMatches).
// The list of declared workers (Engine.hybrids) is copied on write under regMu and read
// by queries with one atomic load.
//
// Cost: dense workers pay nothing (one atomic load per query, no per-group state). A
// declared worker's blocks live in its own per-group tables, not in the positional
// index: a query evaluates each declared worker of the engine under its mutex, starting
// from the query's first block, so a worker that does not hold it costs one lookup per
// group, and one that does costs one lookup per end it holds, the fixed point below. A
// fleet of many hybrid workers therefore answers in time linear in its size (see
// BenchmarkHybridQuery), where dense workers ride the shards' jump search.

// GroupKind is the kind of a KV-cache group.
type GroupKind uint8

// The group kinds.
const (
	// GroupFull is full (and MLA) attention: a cut needs every block before it.
	GroupFull GroupKind = iota + 1
	// GroupSlidingWindow attends to the last Window tokens: a cut needs the blocks that
	// cover the Window-1 tokens before it.
	GroupSlidingWindow
	// GroupMamba keeps a state per block end: a cut needs a state exactly at the cut.
	GroupMamba
)

var groupKindNames = [...]string{GroupFull: "full", GroupSlidingWindow: "sliding_window", GroupMamba: "mamba"}

// String returns the kind's name: "full", "sliding_window" or "mamba".
func (k GroupKind) String() string {
	if k >= GroupFull && int(k) < len(groupKindNames) {
		return groupKindNames[k]
	}
	return fmt.Sprintf("group_kind(%d)", uint8(k))
}

// ParseGroupKind returns the kind named name ("full", "sliding_window", "mamba"), or an
// error wrapping ErrInvalidEvent.
func ParseGroupKind(name string) (GroupKind, error) {
	for k, n := range groupKindNames {
		if n != "" && n == name {
			return GroupKind(k), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown group kind %q (want full, sliding_window or mamba)", ErrInvalidEvent, name)
}

// Group is one KV-cache group of a declaration (EventGroups).
type Group struct {
	Kind GroupKind
	// BlockSize is the group's block size in tokens: a positive multiple of the
	// declaration's Unit (the index's block size), at most MaxGroupSpan units.
	BlockSize int
	// Window is a sliding-window group's window in tokens (at least 1); 0 for the other
	// kinds.
	Window int
}

// Limits on declarations.
const (
	// MaxGroups bounds a declaration's groups (hybrid models have two or three).
	MaxGroups = 64
	// MaxGroupSpan bounds a group's block size in index units.
	MaxGroupSpan = 1 << 12
)

// groupRule is a validated group: its kind, its span (block size in units) and, for a
// sliding window, its lookback in its own blocks, max(1, ceil((W-1) / block size)).
type groupRule struct {
	kind     GroupKind
	span     int
	lookback int
}

// validateGroups checks a declaration and returns its rules.
func validateGroups(unit int, groups []Group) ([]groupRule, error) {
	switch {
	case unit < 1:
		return nil, fmt.Errorf("unit %d (want at least 1 token)", unit)
	case len(groups) == 0:
		return nil, fmt.Errorf("no groups")
	case len(groups) > MaxGroups:
		return nil, fmt.Errorf("%d groups (limit %d)", len(groups), MaxGroups)
	}
	rules := make([]groupRule, len(groups))
	for i, g := range groups {
		if g.BlockSize < 1 || g.BlockSize%unit != 0 || g.BlockSize/unit > MaxGroupSpan {
			return nil, fmt.Errorf("group %d: block size %d is not a multiple of the unit %d between 1 and %d units", i, g.BlockSize, unit, MaxGroupSpan)
		}
		r := groupRule{kind: g.Kind, span: g.BlockSize / unit}
		switch g.Kind {
		case GroupFull, GroupMamba:
			if g.Window != 0 {
				return nil, fmt.Errorf("group %d: a %s group has no window", i, g.Kind)
			}
		case GroupSlidingWindow:
			if g.Window < 1 {
				return nil, fmt.Errorf("group %d: sliding window of %d tokens (want at least 1)", i, g.Window)
			}
			r.lookback = max(1, (g.Window-1+g.BlockSize-1)/g.BlockSize)
		default:
			return nil, fmt.Errorf("group %d: unknown kind %d", i, g.Kind)
		}
		rules[i] = r
	}
	return rules, nil
}

// dense reports whether rules declare what an undeclared worker is: one full group of
// span 1. Such a worker keeps its blocks in the positional index.
func dense(rules []groupRule) bool {
	return len(rules) == 1 && rules[0].kind == GroupFull && rules[0].span == 1
}

// hybridKey names a block's prefix: its namespace, its end (the length of its prefix in
// units) and the prefix hash of its last unit.
type hybridKey struct {
	ns     uint32
	end    uint32
	prefix uint64
}

// hybrid is a declared worker's groups, owned by the worker's mutex.
type hybrid struct {
	// unit and decl are the declaration as given (Groups and snapshots return it).
	unit   int
	decl   []Group
	rules  []groupRule
	cut    int // lcm of the spans: cuts are multiples of it
	groups []hybridGroup
	// n is the worker's (group, tier, seq) entries; per tier in tn.
	n  int
	tn [NumTiers]int
}

// hybridGroup is one group's blocks: per tier, seq -> key, and key -> how many seqs
// hold it. Go maps are seeded per map, so a client cannot aim keys at one bucket.
type hybridGroup struct {
	seqs [NumTiers]map[uint64]hybridKey
	held [NumTiers]map[hybridKey]int32
	// dg is the digest of each tier's entries (digest.go).
	dg [NumTiers]digests
}

func newHybrid(unit int, decl []Group, rules []groupRule) *hybrid {
	h := &hybrid{unit: unit, decl: slices.Clone(decl), rules: rules, cut: 1, groups: make([]hybridGroup, len(rules))}
	for _, r := range rules {
		h.cut = lcm(h.cut, r.span)
	}
	for i := range h.groups {
		for t := range NumTiers {
			h.groups[i].seqs[t] = map[uint64]hybridKey{}
			h.groups[i].held[t] = map[hybridKey]int32{}
		}
	}
	return h
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// groupedEvent reports whether ev must take the groups' path: a declaration, an event
// of a declared worker, or one that names a group or carries per-unit contents.
// Called with w locked.
func groupedEvent(w *worker, ev *Event) bool {
	return ev.Kind == EventGroups || w.hyb != nil || ev.Group != 0 || ev.Contents != nil
}

// applyGrouped applies ev to w (locked) on the groups' path (see groupedEvent).
// Serial: called by the holder of w's mutex.
func (e *Engine) applyGrouped(w *worker, ev *Event) (gone bool, err error) {
	w.setPosition(ev)
	switch ev.Kind {
	case EventGroups:
		return false, e.declareLocked(w, ev)
	case EventCleared, EventRemoveWorker:
		e.endPredictionsOf(w.name)
		e.dropHybridLocked(w, ev.Kind == EventRemoveWorker)
		return e.applyPlain(w, ev)
	}
	h := w.hyb
	if h == nil { // an undeclared worker has group 0 only, of span 1
		switch {
		case ev.Group != 0 && ev.Kind == EventStored:
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no group %d", ErrInvalidEvent, w.name, ev.Group)
		case ev.Group != 0:
			e.skip(w, ev)
			return false, nil
		case ev.Contents != nil:
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no groups: a block has one content hash, not a list", ErrInvalidEvent, w.name)
		}
		return e.applyPlain(w, ev)
	}
	if ev.Group < 0 || ev.Group >= len(h.rules) {
		if ev.Kind == EventStored {
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no group %d", ErrInvalidEvent, w.name, ev.Group)
		}
		e.skip(w, ev)
		return false, nil
	}
	before := h.tn
	switch ev.Kind {
	case EventStored:
		err = e.storeGroupLocked(w, h, ev)
	case EventRemoved:
		w.out.skipped += uint64(h.remove(ev.Group, ev.Tier, ev.Seqs))
	case EventCopied:
		e.skippedCopies.Add(uint64(h.copy(ev.Group, ev.Tier, ev.Seqs)))
	}
	e.publishHybrid(w, h, before)
	if err == nil {
		w.out.events++
	}
	return false, err
}

// skip counts a removed or copied event's seqs as skipped (a group the worker lacks).
func (e *Engine) skip(w *worker, ev *Event) {
	switch ev.Kind {
	case EventRemoved:
		w.out.skipped += uint64(len(ev.Seqs))
	case EventCopied:
		e.skippedCopies.Add(uint64(len(ev.Seqs)))
	}
	w.out.events++
}

// publishHybrid adds h's change of entries since before to the engine's block counts
// and to w's size.
func (e *Engine) publishHybrid(w *worker, h *hybrid, before [NumTiers]int) {
	w.hybSize.Store(int64(h.n))
	total := 0
	for t := range NumTiers {
		if d := h.tn[t] - before[t]; d != 0 {
			e.tierBlocks[t].Add(int64(d))
			total += d
		}
	}
	if total != 0 {
		e.blocks.Add(int64(total))
	}
}

// declareLocked applies a declaration: every block of the worker is dropped, and its
// groups are the event's. A declaration of one full group of span 1 makes it a dense
// worker again. The worker's predictions end, as on a clear.
func (e *Engine) declareLocked(w *worker, ev *Event) error {
	rules, err := validateGroups(ev.Unit, ev.Groups)
	if err != nil { // check validated it already; a declaration is never half applied
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	e.endPredictionsOf(w.name)
	e.dropHybridLocked(w, true)
	w.clearTiers(e)
	if !dense(rules) {
		w.hyb = newHybrid(ev.Unit, ev.Groups, rules)
		e.listHybrid(w, true)
	}
	w.out.events++
	return nil
}

// dropHybridLocked drops a declared worker's blocks (keeping the declaration unless
// forget is set).
func (e *Engine) dropHybridLocked(w *worker, forget bool) {
	h := w.hyb
	if h == nil {
		return
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
	e.publishHybrid(w, h, before)
	if forget {
		w.hyb = nil
		e.listHybrid(w, false)
	}
}

// listHybrid adds w to (or removes it from) the engine's list of declared workers.
func (e *Engine) listHybrid(w *worker, add bool) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	old := e.hybrids.Load()
	var list []*worker
	if old != nil {
		list = slices.Clone(*old)
	}
	i := slices.Index(list, w)
	switch {
	case add && i < 0:
		list = append(list, w)
	case !add && i >= 0:
		list = slices.Delete(list, i, i+1)
	default:
		return
	}
	e.hybrids.Store(&list)
}

// endPredictionsOf ends every prediction of the named worker.
func (e *Engine) endPredictionsOf(name string) {
	if e.preds.Live() == 0 {
		return
	}
	p := &e.preds
	p.Lock()
	p.EndWorker(name)
	p.Unlock()
}

// storeGroupLocked applies a stored event of one group of a declared worker: each block
// covers the group's span of units, its contents are ev.Contents (span values a block)
// or, for a span of 1, its Content. The checks run in the contract's order: contents,
// parent, then duplicate seqs.
func (e *Engine) storeGroupLocked(w *worker, h *hybrid, ev *Event) error {
	g, r := &h.groups[ev.Group], h.rules[ev.Group]
	span := r.span
	if ev.Contents != nil && len(ev.Contents) != span*len(ev.Blocks) || ev.Contents == nil && span != 1 {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: group %d of worker %q spans %d units a block: %d blocks need %d content hashes", ErrInvalidEvent, ev.Group, w.name, span, len(ev.Blocks), span*len(ev.Blocks))
	}
	ns, err := e.eventNamespace(ev.Namespace)
	if err != nil {
		return err
	}
	var at hybridKey // the parent's key; the zero key is the root, above position 0
	if ev.HasParent {
		k, ok := g.seqs[ev.Tier][ev.Parent]
		for t := 0; !ok && t < NumTiers; t++ {
			k, ok = g.seqs[t][ev.Parent]
		}
		if !ok || k.ns != ns {
			e.rejParent.Add(1)
			return fmt.Errorf("%w: group %d of worker %q does not hold %d in this namespace", ErrParentNotFound, ev.Group, w.name, ev.Parent)
		}
		at = k
	}
	if uint64(at.end)+uint64(span*len(ev.Blocks)) >= MaxDepth {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: chain deeper than %d blocks", ErrInvalidEvent, MaxDepth)
	}
	if !w.validateStore(&e.seed, ev.Parent, ev.HasParent, ev.Blocks) {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: a seq appears twice in one event, or equals the parent", ErrInvalidEvent)
	}
	at.ns = ns
	for i, b := range ev.Blocks {
		for j := 0; j < span; j++ {
			c := b.Content
			if ev.Contents != nil {
				c = ev.Contents[i*span+j]
			}
			if at.end == 0 {
				at.prefix = c
			} else {
				at.prefix = e.chain.Step(at.prefix, c, at.end)
			}
			at.end++
		}
		h.put(ev.Group, ev.Tier, b.Seq, at)
	}
	return nil
}

// put makes group gi hold seq at k on tier t (last write wins).
func (h *hybrid) put(gi int, t Tier, seq uint64, k hybridKey) {
	g := &h.groups[gi]
	if old, ok := g.seqs[t][seq]; ok {
		if old == k {
			return
		}
		h.unhold(g, t, old)
		g.dg[t].add(old.ns, digestTerm(seq, old.end), -1)
	} else {
		h.n++
		h.tn[t]++
	}
	g.seqs[t][seq] = k
	g.held[t][k]++
	g.dg[t].add(k.ns, digestTerm(seq, k.end), 1)
}

func (h *hybrid) unhold(g *hybridGroup, t Tier, k hybridKey) {
	if n := g.held[t][k]; n <= 1 {
		delete(g.held[t], k)
	} else {
		g.held[t][k] = n - 1
	}
}

// remove drops seqs from group gi's tier t and returns how many it did not hold.
func (h *hybrid) remove(gi int, t Tier, seqs []uint64) (skipped int) {
	g := &h.groups[gi]
	for _, s := range seqs {
		k, ok := g.seqs[t][s]
		if !ok {
			skipped++
			continue
		}
		delete(g.seqs[t], s)
		h.unhold(g, t, k)
		g.dg[t].add(k.ns, digestTerm(s, k.end), -1)
		h.n--
		h.tn[t]--
	}
	return skipped
}

// copy makes group gi hold on tier t copies of the blocks it holds on another tier
// under seqs (the fastest other tier's); it returns how many seqs it skipped.
func (h *hybrid) copy(gi int, t Tier, seqs []uint64) (skipped int) {
	g := &h.groups[gi]
	for _, s := range seqs {
		found := false
		for o := Tier(0); o < NumTiers && !found; o++ {
			if k, ok := g.seqs[o][s]; ok && o != t {
				h.put(gi, t, s, k)
				found = true
			}
		}
		if _, held := g.seqs[t][s]; !found && !held {
			skipped++
		}
	}
	return skipped
}

// withGroups appends to the answer dst[start:] (sorted) a match for each declared worker
// that scores at least 1, and sorts it again. Dense engines pay one atomic load.
func (e *Engine) withGroups(q *query, content []uint64, dst []Match, start int) []Match {
	list := e.hybrids.Load()
	if list == nil || len(*list) == 0 {
		return dst
	}
	q.tpre = q.tpre[:0]
	n := len(dst)
	for _, w := range *list {
		if m, ok := e.hybridMatch(q, w, content); ok {
			dst = append(dst, m)
		}
	}
	if len(dst) > n {
		q.sortMatches(dst[start:])
	}
	return dst
}

// hybridMatch scores declared worker w for the query, under w's mutex: per tier t, the
// largest cut every group accepts counting the blocks held on tier t or a faster one.
func (e *Engine) hybridMatch(q *query, w *worker, content []uint64) (Match, bool) {
	w.lockMu()
	defer w.unlockMu()
	h := w.hyb
	if w.dead || h == nil || h.n == 0 {
		return Match{}, false
	}
	var tiers [NumTiers]int
	for t := range NumTiers {
		if t > 0 && h.tn[t] == 0 {
			tiers[t] = tiers[t-1] // nothing on this tier: the faster tiers' cut
			continue
		}
		tiers[t] = e.hybridScore(q, h, content, Tier(t))
	}
	s := tiers[NumTiers-1]
	if s == 0 {
		return Match{}, false
	}
	return Match{Worker: w.name, Score: s, Size: h.n, Tiers: tiers}, true
}

// hybridScore is the largest cut of the query every group of h accepts, counting the
// blocks on tiers 0..t: vLLM's fixed point, each group shortening the candidate to the
// longest cut at most it that the group accepts, until none shortens it. Every cut
// above the result was refused by some group, and the result is accepted by all.
func (e *Engine) hybridScore(q *query, h *hybrid, content []uint64, t Tier) int {
	k := len(content) / h.cut * h.cut
	for k > 0 {
		shortened := false
		for gi, r := range h.rules {
			if nk := e.longestAccepted(q, h, gi, r, content, t, k); nk < k {
				k, shortened = nk, true
				if k == 0 {
					return 0
				}
			}
		}
		if !shortened {
			return k
		}
	}
	return 0
}

// longestAccepted is the longest cut at most k (a multiple of h.cut) that group gi
// alone accepts.
func (e *Engine) longestAccepted(q *query, h *hybrid, gi int, r groupRule, content []uint64, t Tier, k int) int {
	switch r.kind {
	case GroupFull:
		// The ends j*span held from j = 1 on, as far as k reaches.
		run := 0
		for run+r.span <= k && e.groupHolds(q, h, gi, content, t, run+r.span) {
			run += r.span
		}
		return run / h.cut * h.cut
	case GroupSlidingWindow:
		for ; k > 0; k -= h.cut {
			n := k / r.span
			ok := true
			for j := max(1, n-r.lookback+1); j <= n && ok; j++ {
				ok = e.groupHolds(q, h, gi, content, t, j*r.span)
			}
			if ok {
				return k
			}
		}
	case GroupMamba:
		for ; k > 0; k -= h.cut {
			if e.groupHolds(q, h, gi, content, t, k) {
				return k
			}
		}
	}
	return 0
}

// groupHolds reports whether group gi holds, on a tier 0..t, a block whose prefix is
// the query's first end units.
func (e *Engine) groupHolds(q *query, h *hybrid, gi int, content []uint64, t Tier, end int) bool {
	k := hybridKey{ns: q.ns, end: uint32(end), prefix: q.tierPrefix(&e.chain, content, end-1)}
	g := &h.groups[gi]
	for tt := Tier(0); tt <= t; tt++ {
		if g.held[tt][k] > 0 {
			return true
		}
	}
	return false
}

// captureGroups appends a worker's groups field of a snapshot (see snapshot.go) to buf:
// 0 for h nil; each block's namespace is written as its id, whose offset goes to nsAt
// unless it is the default namespace (see captureWorkers).
func captureGroups(buf *bytes.Buffer, h *hybrid, nsAt *[]int) {
	var b [groupEntry]byte
	if h == nil {
		buf.Write(b[:4])
		return
	}
	binary.LittleEndian.PutUint32(b[:4], uint32(len(h.decl)))
	binary.LittleEndian.PutUint32(b[4:], uint32(h.unit))
	buf.Write(b[:8])
	type entry struct {
		seq uint64
		k   hybridKey
	}
	var entries []entry
	for _, g := range h.decl {
		binary.LittleEndian.PutUint32(b[0:], uint32(g.Kind))
		binary.LittleEndian.PutUint32(b[4:], uint32(g.BlockSize))
		binary.LittleEndian.PutUint32(b[8:], uint32(g.Window))
		buf.Write(b[:12])
	}
	for i := range h.rules {
		for t := range NumTiers {
			entries = entries[:0]
			for seq, k := range h.groups[i].seqs[t] {
				entries = append(entries, entry{seq, k})
			}
			slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
			binary.LittleEndian.PutUint64(b[:8], uint64(len(entries)))
			buf.Write(b[:8])
			for _, x := range entries {
				if x.k.ns != 0 {
					*nsAt = append(*nsAt, buf.Len()+20)
				}
				binary.LittleEndian.PutUint64(b[0:], x.seq)
				binary.LittleEndian.PutUint64(b[8:], x.k.prefix)
				binary.LittleEndian.PutUint32(b[16:], x.k.end)
				binary.LittleEndian.PutUint32(b[20:], x.k.ns)
				buf.Write(b[:])
			}
		}
	}
}

// loadGroups reads a worker's groups field of a snapshot into w (locked); a failure is
// left in p.err. A snapshot's declaration is checked as an event's is
// (validateGroups), and a dense declaration is refused: the writer never emits one.
func (e *Engine) loadGroups(p *snapReader, w *worker, nsCount uint32, nsIDs []uint32) {
	n := p.u32()
	if p.err != nil || n == 0 {
		return
	}
	unit := p.u32()
	if n > MaxGroups || unit > 1<<30 {
		p.fail(fmt.Sprintf("worker %q: %d groups of unit %d", w.name, n, unit))
		return
	}
	if w.seqs.n != 0 || w.tl.Load() != nil {
		p.fail(fmt.Sprintf("worker %q: blocks outside its groups", w.name))
		return
	}
	decl := make([]Group, n)
	for i := range decl {
		kind, bs, win := p.u32(), p.u32(), p.u32()
		if p.err != nil {
			return
		}
		if kind > 255 || bs > 1<<30 || win > 1<<30 {
			p.fail(fmt.Sprintf("worker %q: group %d malformed", w.name, i))
			return
		}
		decl[i] = Group{Kind: GroupKind(kind), BlockSize: int(bs), Window: int(win)}
	}
	rules, err := validateGroups(int(unit), decl)
	if err != nil {
		p.fail(fmt.Sprintf("worker %q: %v", w.name, err))
		return
	}
	if dense(rules) {
		p.fail(fmt.Sprintf("worker %q: a dense declaration", w.name))
		return
	}
	h := newHybrid(int(unit), decl, rules)
	for gi, r := range rules {
		for t := range Tier(NumTiers) {
			cnt := p.u64()
			if p.err != nil {
				return
			}
			if cnt > uint64(len(p.b))/groupEntry {
				p.fail(fmt.Sprintf("worker %q claims %d blocks in group %d", w.name, cnt, gi))
				return
			}
			var last uint64
			for j := uint64(0); j < cnt; j++ {
				seq, prefix, end, ns := p.u64(), p.u64(), p.u32(), p.u32()
				if p.err != nil {
					return
				}
				switch {
				case j > 0 && seq <= last:
					p.fail("group seqs out of order")
				case end == 0 || end >= MaxDepth || int(end)%r.span != 0 || ns > nsCount:
					p.fail(fmt.Sprintf("worker %q: group %d block (seq %d) ends at %d", w.name, gi, seq, end))
				}
				if p.err != nil {
					return
				}
				last = seq
				if ns > 0 {
					ns = nsIDs[ns-1]
				}
				h.put(gi, t, seq, hybridKey{ns: ns, end: end, prefix: prefix})
			}
		}
	}
	w.hyb = h
	e.listHybrid(w, true)
	e.publishHybrid(w, h, [NumTiers]int{})
}

// Groups returns the KV-cache groups the worker declared (EventGroups) and the unit
// they were declared in; ok is false for an unknown worker and for one that declared
// none (or one full group of the unit, which is the same). An ingester that resumes a
// worker restored from a snapshot asks it, so as not to declare again (which would drop
// the worker's blocks).
func (e *Engine) Groups(worker string) (unit int, groups []Group, ok bool) {
	w := e.lookup(worker)
	if w == nil {
		return 0, nil, false
	}
	w.lockMu()
	defer w.unlockMu()
	if w.dead || w.hyb == nil {
		return 0, nil, false
	}
	return w.hyb.unit, slices.Clone(w.hyb.decl), true
}

// ValidateGroups checks a declaration of groups in unit (the index's block size, in
// tokens) as an EventGroups event would be checked, without an engine: a configuration
// that declares a model's groups up front is refused at start, not at its first event.
func ValidateGroups(unit int, groups []Group) error {
	if _, err := validateGroups(unit, groups); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	return nil
}
