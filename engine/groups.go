package engine

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/engine/internal/worker"
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
// Who owns what: a declared worker's groups (worker.Hybrid, its per-group tables)
// belong to the holder of its mutex, like the rest of its bookkeeping; queries read
// them under that mutex (hybridMatch). This file has the declarations' rules, the
// events' checks and the queries' cuts.
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

// validateGroups checks a declaration and returns its rules: per group its kind, its
// span (block size in units), its window and, for a sliding window, its lookback in its
// own blocks, max(1, ceil((W-1) / block size)).
func validateGroups(unit int, groups []Group) ([]worker.Rule, error) {
	switch {
	case unit < 1:
		return nil, fmt.Errorf("unit %d (want at least 1 token)", unit)
	case len(groups) == 0:
		return nil, fmt.Errorf("no groups")
	case len(groups) > MaxGroups:
		return nil, fmt.Errorf("%d groups (limit %d)", len(groups), MaxGroups)
	}
	rules := make([]worker.Rule, len(groups))
	for i, g := range groups {
		if g.BlockSize < 1 || g.BlockSize%unit != 0 || g.BlockSize/unit > MaxGroupSpan {
			return nil, fmt.Errorf("group %d: block size %d is not a multiple of the unit %d between 1 and %d units", i, g.BlockSize, unit, MaxGroupSpan)
		}
		r := worker.Rule{Kind: uint8(g.Kind), Span: g.BlockSize / unit, Window: g.Window}
		switch g.Kind {
		case GroupFull, GroupMamba:
			if g.Window != 0 {
				return nil, fmt.Errorf("group %d: a %s group has no window", i, g.Kind)
			}
		case GroupSlidingWindow:
			if g.Window < 1 {
				return nil, fmt.Errorf("group %d: sliding window of %d tokens (want at least 1)", i, g.Window)
			}
			r.Lookback = max(1, (g.Window-1+g.BlockSize-1)/g.BlockSize)
		default:
			return nil, fmt.Errorf("group %d: unknown kind %d", i, g.Kind)
		}
		rules[i] = r
	}
	return rules, nil
}

// dense reports whether rules declare what an undeclared worker is: one full group of
// span 1. Such a worker keeps its blocks in the positional index.
func dense(rules []worker.Rule) bool {
	return len(rules) == 1 && GroupKind(rules[0].Kind) == GroupFull && rules[0].Span == 1
}

// declaration returns the groups that h was declared with (their rules keep the
// declaration exactly: a block size is its span in units).
func declaration(h *worker.Hybrid) []Group {
	out := make([]Group, len(h.Rules()))
	for i, r := range h.Rules() {
		out[i] = Group{Kind: GroupKind(r.Kind), BlockSize: r.Span * h.Unit(), Window: r.Window}
	}
	return out
}

// groupedEvent reports whether ev must take the groups' path: a declaration, an event
// of a declared worker, or one that names a group or carries per-unit contents.
// Called with w locked.
func groupedEvent(w *worker.Worker, ev *Event) bool {
	return ev.Kind == EventGroups || w.Hybrid() != nil || ev.Group != 0 || ev.Contents != nil
}

// applyGrouped applies ev to w (locked) on the groups' path (see groupedEvent).
// Serial: called by the holder of w's mutex.
func (e *Engine) applyGrouped(w *worker.Worker, ev *Event) (gone bool, err error) {
	setPosition(w, ev)
	switch ev.Kind {
	case EventGroups:
		return false, e.declareLocked(w, ev)
	case EventCleared, EventRemoveWorker:
		e.endPredictionsOf(w.Name())
		e.dropHybridLocked(w, ev.Kind == EventRemoveWorker)
		return e.applyPlain(w, ev)
	}
	h := w.Hybrid()
	if h == nil { // an undeclared worker has group 0 only, of span 1
		switch {
		case ev.Group != 0 && ev.Kind == EventStored:
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no group %d", ErrInvalidEvent, w.Name(), ev.Group)
		case ev.Group != 0:
			e.skip(w, ev)
			return false, nil
		case ev.Contents != nil:
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no groups: a block has one content hash, not a list", ErrInvalidEvent, w.Name())
		}
		return e.applyPlain(w, ev)
	}
	if ev.Group < 0 || ev.Group >= len(h.Rules()) {
		if ev.Kind == EventStored {
			e.rejInvalid.Add(1)
			return false, fmt.Errorf("%w: worker %q has declared no group %d", ErrInvalidEvent, w.Name(), ev.Group)
		}
		e.skip(w, ev)
		return false, nil
	}
	before := h.TierLens()
	switch ev.Kind {
	case EventStored:
		err = e.storeGroupLocked(w, h, ev)
	case EventRemoved:
		w.Outbox().Skipped += uint64(h.Remove(ev.Group, worker.Tier(ev.Tier), ev.Seqs))
	case EventCopied:
		e.skippedCopies.Add(uint64(h.Copy(ev.Group, worker.Tier(ev.Tier), ev.Seqs)))
	}
	w.PublishGroups(&e.env, before)
	if err == nil {
		w.Outbox().Events++
	}
	return false, err
}

// skip counts a removed or copied event's seqs as skipped (a group the worker lacks).
func (e *Engine) skip(w *worker.Worker, ev *Event) {
	switch ev.Kind {
	case EventRemoved:
		w.Outbox().Skipped += uint64(len(ev.Seqs))
	case EventCopied:
		e.skippedCopies.Add(uint64(len(ev.Seqs)))
	}
	w.Outbox().Events++
}

// declareLocked applies a declaration: every block of the worker is dropped, and its
// groups are the event's. A declaration of one full group of span 1 makes it a dense
// worker again. The worker's predictions end, as on a clear.
func (e *Engine) declareLocked(w *worker.Worker, ev *Event) error {
	rules, err := validateGroups(ev.Unit, ev.Groups)
	if err != nil { // check validated it already; a declaration is never half applied
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	e.endPredictionsOf(w.Name())
	e.dropHybridLocked(w, true)
	w.Clear(&e.env)
	if !dense(rules) {
		w.Declare(worker.NewHybrid(ev.Unit, rules))
		e.listHybrid(w, true)
	}
	w.Outbox().Events++
	return nil
}

// dropHybridLocked drops a declared worker's blocks (keeping the declaration unless
// forget is set).
func (e *Engine) dropHybridLocked(w *worker.Worker, forget bool) {
	if w.DropGroups(&e.env, forget) && forget {
		e.listHybrid(w, false)
	}
}

// listHybrid adds w to (or removes it from) the engine's list of declared workers.
func (e *Engine) listHybrid(w *worker.Worker, add bool) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	old := e.hybrids.Load()
	var list []*worker.Worker
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
func (e *Engine) storeGroupLocked(w *worker.Worker, h *worker.Hybrid, ev *Event) error {
	span := h.Rules()[ev.Group].Span
	if ev.Contents != nil && len(ev.Contents) != span*len(ev.Blocks) || ev.Contents == nil && span != 1 {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: group %d of worker %q spans %d units a block: %d blocks need %d content hashes", ErrInvalidEvent, ev.Group, w.Name(), span, len(ev.Blocks), span*len(ev.Blocks))
	}
	ns, err := e.eventNamespace(ev.Namespace)
	if err != nil {
		return err
	}
	tier := worker.Tier(ev.Tier)
	var at worker.GroupKey // the parent's key; the zero key is the root, above position 0
	if ev.HasParent {
		k, ok := h.Lookup(ev.Group, tier, ev.Parent)
		for t := worker.Tier(0); !ok && t < worker.NumTiers; t++ {
			k, ok = h.Lookup(ev.Group, t, ev.Parent)
		}
		if !ok || k.NS != ns {
			e.rejParent.Add(1)
			return fmt.Errorf("%w: group %d of worker %q does not hold %d in this namespace", ErrParentNotFound, ev.Group, w.Name(), ev.Parent)
		}
		at = k
	}
	if uint64(at.End)+uint64(span*len(ev.Blocks)) >= MaxDepth {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: chain deeper than %d blocks", ErrInvalidEvent, MaxDepth)
	}
	if !w.Outbox().ValidStore(&e.env, ev.Parent, ev.HasParent, blocksOf(ev.Blocks)) {
		e.rejInvalid.Add(1)
		return fmt.Errorf("%w: a seq appears twice in one event, or equals the parent", ErrInvalidEvent)
	}
	at.NS = ns
	for i, b := range ev.Blocks {
		for j := 0; j < span; j++ {
			c := b.Content
			if ev.Contents != nil {
				c = ev.Contents[i*span+j]
			}
			if at.End == 0 {
				at.Prefix = c
			} else {
				at.Prefix = e.env.Chain.Step(at.Prefix, c, at.End)
			}
			at.End++
		}
		h.Put(ev.Group, tier, b.Seq, at)
	}
	return nil
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
func (e *Engine) hybridMatch(q *query, w *worker.Worker, content []uint64) (Match, bool) {
	e.lockWorker(w)
	defer e.unlockWorker(w)
	h := w.Hybrid()
	if w.Dead() || h == nil || h.Len() == 0 {
		return Match{}, false
	}
	var tiers [NumTiers]int
	tn := h.TierLens()
	for t := range NumTiers {
		if t > 0 && tn[t] == 0 {
			tiers[t] = tiers[t-1] // nothing on this tier: the faster tiers' cut
			continue
		}
		tiers[t] = e.hybridScore(q, h, content, worker.Tier(t))
	}
	s := tiers[NumTiers-1]
	if s == 0 {
		return Match{}, false
	}
	return Match{Worker: w.Name(), Score: s, Size: h.Len(), Tiers: tiers}, true
}

// hybridScore is the largest cut of the query every group of h accepts, counting the
// blocks on tiers 0..t: vLLM's fixed point, each group shortening the candidate to the
// longest cut at most it that the group accepts, until none shortens it. Every cut
// above the result was refused by some group, and the result is accepted by all.
func (e *Engine) hybridScore(q *query, h *worker.Hybrid, content []uint64, t worker.Tier) int {
	k := len(content) / h.Cut() * h.Cut()
	for k > 0 {
		shortened := false
		for gi, r := range h.Rules() {
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

// longestAccepted is the longest cut at most k (a multiple of h.Cut) that group gi
// alone accepts.
func (e *Engine) longestAccepted(q *query, h *worker.Hybrid, gi int, r worker.Rule, content []uint64, t worker.Tier, k int) int {
	cut := h.Cut()
	switch GroupKind(r.Kind) {
	case GroupFull:
		// The ends j*span held from j = 1 on, as far as k reaches.
		run := 0
		for run+r.Span <= k && e.groupHolds(q, h, gi, content, t, run+r.Span) {
			run += r.Span
		}
		return run / cut * cut
	case GroupSlidingWindow:
		for ; k > 0; k -= cut {
			n := k / r.Span
			ok := true
			for j := max(1, n-r.Lookback+1); j <= n && ok; j++ {
				ok = e.groupHolds(q, h, gi, content, t, j*r.Span)
			}
			if ok {
				return k
			}
		}
	case GroupMamba:
		for ; k > 0; k -= cut {
			if e.groupHolds(q, h, gi, content, t, k) {
				return k
			}
		}
	}
	return 0
}

// groupHolds reports whether group gi holds, on a tier 0..t, a block whose prefix is
// the query's first end units.
func (e *Engine) groupHolds(q *query, h *worker.Hybrid, gi int, content []uint64, t worker.Tier, end int) bool {
	k := worker.GroupKey{NS: q.ns, End: uint32(end), Prefix: q.tierPrefix(q.ch, content, end-1)}
	for tt := worker.Tier(0); tt <= t; tt++ {
		if h.Holds(gi, tt, k) {
			return true
		}
	}
	return false
}

// captureGroups appends a worker's groups field of a snapshot (see snapshot.go) to buf:
// 0 for h nil; each block's namespace is written as its id, whose offset goes to nsAt
// unless it is the default namespace (see captureWorkers).
func captureGroups(buf *bytes.Buffer, h *worker.Hybrid, nsAt *[]int) {
	var b [groupEntry]byte
	if h == nil {
		buf.Write(b[:4])
		return
	}
	decl := declaration(h)
	binary.LittleEndian.PutUint32(b[:4], uint32(len(decl)))
	binary.LittleEndian.PutUint32(b[4:], uint32(h.Unit()))
	buf.Write(b[:8])
	var entries []worker.GroupEntry
	for _, g := range decl {
		binary.LittleEndian.PutUint32(b[0:], uint32(g.Kind))
		binary.LittleEndian.PutUint32(b[4:], uint32(g.BlockSize))
		binary.LittleEndian.PutUint32(b[8:], uint32(g.Window))
		buf.Write(b[:12])
	}
	for i := range h.Rules() {
		for t := range worker.Tier(NumTiers) {
			entries = h.AppendEntries(i, t, entries[:0])
			slices.SortFunc(entries, func(a, b worker.GroupEntry) int { return cmp.Compare(a.Seq, b.Seq) })
			binary.LittleEndian.PutUint64(b[:8], uint64(len(entries)))
			buf.Write(b[:8])
			for _, x := range entries {
				if x.Key.NS != 0 {
					*nsAt = append(*nsAt, buf.Len()+20)
				}
				binary.LittleEndian.PutUint64(b[0:], x.Seq)
				binary.LittleEndian.PutUint64(b[8:], x.Key.Prefix)
				binary.LittleEndian.PutUint32(b[16:], x.Key.End)
				binary.LittleEndian.PutUint32(b[20:], x.Key.NS)
				buf.Write(b[:])
			}
		}
	}
}

// loadGroups reads a worker's groups field of a snapshot into w (locked); a failure is
// left in p.err. A snapshot's declaration is checked as an event's is
// (validateGroups), and a dense declaration is refused: the writer never emits one.
func (e *Engine) loadGroups(p *snapReader, w *worker.Worker, nsCount uint32, nsIDs []uint32) {
	n := p.u32()
	if p.err != nil || n == 0 {
		return
	}
	unit := p.u32()
	if n > MaxGroups || unit > 1<<30 {
		p.fail(fmt.Sprintf("worker %q: %d groups of unit %d", w.Name(), n, unit))
		return
	}
	if w.Len() != 0 || w.HasTiers() {
		p.fail(fmt.Sprintf("worker %q: blocks outside its groups", w.Name()))
		return
	}
	decl := make([]Group, n)
	for i := range decl {
		kind, bs, win := p.u32(), p.u32(), p.u32()
		if p.err != nil {
			return
		}
		if kind > 255 || bs > 1<<30 || win > 1<<30 {
			p.fail(fmt.Sprintf("worker %q: group %d malformed", w.Name(), i))
			return
		}
		decl[i] = Group{Kind: GroupKind(kind), BlockSize: int(bs), Window: int(win)}
	}
	rules, err := validateGroups(int(unit), decl)
	if err != nil {
		p.fail(fmt.Sprintf("worker %q: %v", w.Name(), err))
		return
	}
	if dense(rules) {
		p.fail(fmt.Sprintf("worker %q: a dense declaration", w.Name()))
		return
	}
	h := worker.NewHybrid(int(unit), rules)
	for gi, r := range rules {
		for t := range worker.Tier(NumTiers) {
			cnt := p.u64()
			if p.err != nil {
				return
			}
			if cnt > uint64(len(p.b))/groupEntry {
				p.fail(fmt.Sprintf("worker %q claims %d blocks in group %d", w.Name(), cnt, gi))
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
				case end == 0 || end >= MaxDepth || int(end)%r.Span != 0 || ns > nsCount:
					p.fail(fmt.Sprintf("worker %q: group %d block (seq %d) ends at %d", w.Name(), gi, seq, end))
				}
				if p.err != nil {
					return
				}
				last = seq
				if ns > 0 {
					ns = nsIDs[ns-1]
				}
				h.Put(gi, t, seq, worker.GroupKey{NS: ns, End: end, Prefix: prefix})
			}
		}
	}
	w.Declare(h)
	e.listHybrid(w, true)
	w.PublishGroups(&e.env, [NumTiers]int{})
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
	e.lockWorker(w)
	defer e.unlockWorker(w)
	if w.Dead() || w.Hybrid() == nil {
		return 0, nil, false
	}
	return w.Hybrid().Unit(), declaration(w.Hybrid()), true
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
