package subscriber

import (
	"slices"
	"sort"
	"strconv"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/kvevents"
)

// Hybrid models under their reuse rules (GroupFilter.Hybrid).
//
// vLLM publishes a hybrid model's blocks per KV-cache group: every stored event names
// its group (group_idx), the group's kind (kv_cache_spec_kind), its block size and, for
// a sliding window, the window (kv_cache_spec_sliding_window); a removal names only the
// group. In hybrid mode the subscriber declares the worker's groups to the index
// (engine.EventGroups) and hands it every group's events, so a match is the longest cut
// every group accepts (full attention: every block before the cut; sliding window: the
// blocks covering the window's last W-1 tokens before it; Mamba: a state exactly at it).
//
// The declaration comes from the configuration (GroupFilter.Declared, in group_idx
// order) or is learned from the stored events: each batch is scanned for groups before
// its events are applied, so the groups a model stores in one step are declared
// together. A group first seen after the worker holds blocks changes the declaration,
// and a declaration drops the worker's blocks: the worker is invalidated (stale until a
// resync replays it from sequence 0, as after any loss) rather than left holding less
// than the engine without saying so. A model that turns out dense (one full-attention
// group of the index's block size) is never declared and pays nothing.
//
// Owner: the subscriber's Run goroutine, like the rest of its state.

// hybridState is what the subscriber knows of its worker's groups.
type hybridState struct {
	unit  int
	fixed bool // the declaration is the configuration's: nothing is learned

	// learned maps a group_idx to its spec, as stored events gave it (learned mode), at
	// most engine.MaxGroups of them; unmodelled records the group_idx values of kinds the
	// index has no rule for, with their label.
	learned    map[int]engine.Group
	unmodelled map[int]string

	// order maps a group_idx to its group in the declaration in force, decl.
	order map[int]int
	decl  []engine.Group
	// sent is set once the index holds decl (declared by us, restored from a snapshot,
	// or a dense decl, which needs no declaration); held once a block was stored under
	// it since the last declaration or clear.
	sent, held bool
}

// groupKind maps a kv_cache_spec_kind to the index's rule, or false for a kind the
// index does not model (chunked local attention, cross attention, encoder-only), whose
// groups are skipped and counted.
func groupKind(spec string) (engine.GroupKind, bool) {
	switch spec {
	case "full_attention", "mla_attention", "sink_full_attention":
		return engine.GroupFull, true
	case "sliding_window", "sliding_window_mla":
		return engine.GroupSlidingWindow, true
	case "mamba":
		return engine.GroupMamba, true
	}
	return 0, false
}

// newHybridState returns the hybrid state of cfg, nil when cfg is not in hybrid mode.
func newHybridState(cfg *Config) *hybridState {
	g := cfg.Groups
	if !g.Hybrid && len(g.Declared) == 0 {
		return nil
	}
	h := &hybridState{unit: cfg.BlockSize, learned: map[int]engine.Group{}, unmodelled: map[int]string{}}
	if len(g.Declared) > 0 {
		h.fixed = true
		h.decl = slices.Clone(g.Declared)
		h.order = map[int]int{}
		for i := range h.decl {
			h.order[i] = i
		}
		h.sent = isDense(h.unit, h.decl)
		return h
	}
	// Until a store says otherwise, group 0 is the one full group of a dense model.
	h.decl = []engine.Group{{Kind: engine.GroupFull, BlockSize: h.unit}}
	h.order = map[int]int{0: 0}
	h.sent = true
	return h
}

func isDense(unit int, decl []engine.Group) bool {
	return len(decl) == 1 && decl[0].Kind == engine.GroupFull && decl[0].BlockSize == unit
}

// groupsOf is what an Index that keeps declarations (*engine.Engine) tells a resuming
// subscriber.
type groupsOf interface {
	Groups(worker string) (unit int, groups []engine.Group, ok bool)
}

// resume adopts the declaration the index restored for the worker when it is the one in
// force (so a warm restart keeps the worker's blocks), else leaves it to be declared,
// which drops them: the worker is then held but not declared, and the first declaration
// invalidates it.
func (h *hybridState) resume(idx Index, worker string) {
	h.held = true
	gi, ok := idx.(groupsOf)
	if !ok {
		return
	}
	unit, groups, ok := gi.Groups(worker)
	switch {
	case !ok: // the index holds the worker dense
		h.sent = isDense(h.unit, h.decl)
	case h.fixed:
		h.sent = unit == h.unit && slices.Equal(groups, h.decl)
	default:
		// A learned declaration's group_idx mapping is not in the snapshot: it is
		// learned again, and declared again (a fixed declaration keeps the blocks).
		h.sent = false
	}
}

// scan learns the groups of a batch's stored events (learned mode) and returns whether
// the declaration changed.
func (h *hybridState) scan(b *kvevents.Batch) bool {
	if h.fixed {
		return false
	}
	changed := false
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind != kvevents.Stored || e.HashOnly || !e.HasGroupIdx && e.SpecKind == "" {
			continue
		}
		g := groupIdx(e)
		if _, ok := h.learned[g]; ok {
			continue
		}
		if _, ok := h.unmodelled[g]; ok {
			continue
		}
		spec, label, ok := specOf(e)
		if !ok || len(h.learned) >= engine.MaxGroups {
			if len(h.unmodelled) < engine.MaxGroups {
				h.unmodelled[g] = label
			}
			continue
		}
		h.learned[g] = spec
		changed = true
	}
	if !changed {
		return false
	}
	idx := make([]int, 0, len(h.learned))
	for g := range h.learned {
		idx = append(idx, g)
	}
	sort.Ints(idx)
	decl := make([]engine.Group, len(idx))
	order := make(map[int]int, len(idx))
	for i, g := range idx {
		decl[i], order[g] = h.learned[g], i
	}
	if slices.Equal(decl, h.decl) {
		h.order = order
		return false
	}
	h.decl, h.order, h.sent = decl, order, isDense(h.unit, decl)
	return true
}

// specOf reads a stored event's group spec, or the label to skip it under.
func specOf(e *kvevents.Event) (engine.Group, string, bool) {
	kind := e.SpecKind
	if kind == "" {
		if groupIdx(e) != 0 {
			return engine.Group{}, "group " + strconv.Itoa(e.GroupIdx), false
		}
		kind = "full_attention" // group 0 without a kind: a model that predates kinds
	}
	k, ok := groupKind(kind)
	if !ok {
		return engine.Group{}, kind, false
	}
	g := engine.Group{Kind: k, BlockSize: e.BlockSize}
	if k == engine.GroupSlidingWindow {
		if !e.HasSlidingWindow || e.SlidingWindow < 1 {
			return engine.Group{}, kind + " without a window", false
		}
		g.Window = e.SlidingWindow
	}
	return g, "", true
}

func groupIdx(e *kvevents.Event) int {
	if e.HasGroupIdx {
		return e.GroupIdx
	}
	return 0
}

// group returns the declared group an event of group_idx g goes to, or false with the
// label to skip it under.
func (h *hybridState) group(e *kvevents.Event) (int, string, bool) {
	g := groupIdx(e)
	if i, ok := h.order[g]; ok {
		return i, "", true
	}
	if l, ok := h.unmodelled[g]; ok {
		return 0, l, false
	}
	return 0, groupLabel(e), false
}

// hybridBatch brings the index's declaration up to date before a batch's events are
// applied: a learned group changes it, and a worker that already holds blocks under
// the old one is invalidated first (the declaration drops them).
func (s *Subscriber) hybridBatch(b *kvevents.Batch) error {
	h := s.hyb
	h.scan(b)
	if h.sent {
		return nil
	}
	return s.declare()
}

// declare sends the declaration in force.
func (s *Subscriber) declare() error {
	h := s.hyb
	if h.held {
		if err := s.invalidate(); err != nil {
			return err
		}
		s.warn("KV-cache groups changed under held blocks; worker invalidated", "groups", len(h.decl))
	}
	err := s.apply(&engine.Event{Kind: engine.EventGroups, Worker: s.cfg.Worker, Unit: h.unit, Groups: slices.Clone(h.decl)})
	if err != nil {
		return err
	}
	s.local.GroupDeclarations++
	h.sent, h.held = true, false
	return nil
}

// hybridEvent completes ev, the index event of e, with its group; false means e is of a
// group the index does not model (or of a block size its group does not have) and was
// counted as skipped.
func (s *Subscriber) hybridEvent(e *kvevents.Event, ev *engine.Event) bool {
	h := s.hyb
	gi, label, ok := h.group(e)
	if ok && e.Kind == kvevents.Stored && !e.HashOnly && e.BlockSize != 0 && e.BlockSize != h.decl[gi].BlockSize {
		ok, label = false, "block size "+strconv.Itoa(e.BlockSize)+" in group "+strconv.Itoa(groupIdx(e))
	}
	if !ok {
		s.local.Rejected[ReasonKVGroup]++
		s.diag.skipGroup(label)
		return false
	}
	if len(h.decl) == 1 && isDense(h.unit, h.decl) {
		return true // the dense path: group 0, one content hash a block
	}
	ev.Group = gi
	if ev.Kind == engine.EventStored && h.decl[gi].BlockSize != h.unit {
		// The decoder cut each block into its units' content hashes (kvevents.Config.Units).
		ev.Contents = e.Contents
	}
	return true
}
