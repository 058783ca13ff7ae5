package subscriber

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/vllmhash"
)

// Silent-miss diagnostics: the ways cache-aware routing stops working while nothing
// fails (events never arrive, the engine cuts blocks at another size, its stores do not
// chain, its hashes do not follow from what it publishes), and the filter that keeps the
// KV-cache groups of hybrid models that cannot serve a prefix out of the index.
//
// The owner goroutine counts (diagState); publish copies the counts into Status.Diag;
// Problems turns a Status into problems at a given time, so every diagnostic is a pure
// function of counters and clocks (tests set both).

// Defaults of DiagnoseConfig.
const (
	DefaultNoEventsAfter  = 2 * time.Minute
	DefaultIdleAfter      = 5 * time.Minute
	DefaultDiagWindow     = time.Minute
	DefaultParentMissRate = 0.05
	DefaultMinSamples     = 8
	DefaultHashSample     = 1
	DefaultHashTracked    = 1 << 16
	maxHashTracked        = 1 << 22
	maxGroupKinds         = 16 // distinct skipped-group labels kept; more are "other"
	maxLearnedGroups      = 256
)

// DiagnoseConfig sets the thresholds of the diagnostics. Zero fields take the defaults.
type DiagnoseConfig struct {
	// NoEventsAfter: a worker live this long without a single event is reported
	// (no_events). Default 2m; negative: never.
	NoEventsAfter time.Duration
	// IdleAfter: a worker the router picked (NoteServed) more than this after its last
	// event is reported (events_stopped). Default 5m; negative: never.
	IdleAfter time.Duration
	// Window is the period rates are measured over (the last one to two windows count).
	// Default 1m; 1s..1h.
	Window time.Duration
	// ParentMissRate is the fraction of stores rejected for an unknown parent above which
	// parent_not_found is reported. Default 0.05; (0, 1].
	ParentMissRate float64
	// MinSamples is the fewest events a rate is judged on. Default 8; 1..1e6.
	MinSamples int
}

func (c DiagnoseConfig) withDefaults() DiagnoseConfig {
	if c.NoEventsAfter == 0 {
		c.NoEventsAfter = DefaultNoEventsAfter
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = DefaultIdleAfter
	}
	if c.Window == 0 {
		c.Window = DefaultDiagWindow
	}
	if c.ParentMissRate == 0 {
		c.ParentMissRate = DefaultParentMissRate
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultMinSamples
	}
	return c
}

func (c DiagnoseConfig) validate() error {
	switch {
	case c.Window < time.Second || c.Window > time.Hour:
		return fmt.Errorf("Diagnose.Window %v outside [1s, 1h]", c.Window)
	case !(c.ParentMissRate > 0 && c.ParentMissRate <= 1):
		return fmt.Errorf("Diagnose.ParentMissRate %v outside (0, 1]", c.ParentMissRate)
	case c.MinSamples < 1 || c.MinSamples > 1_000_000:
		return fmt.Errorf("Diagnose.MinSamples %d outside [1, 1000000]", c.MinSamples)
	}
	return nil
}

// HashCheck configures the check of the engine's own block hashes (package vllmhash):
// vLLM with PYTHONHASHSEED set and prefix_caching_hash_algo "sha256" (its default) or
// "sha256_cbor". Each stored chain is recomputed from its root and compared with the
// published hashes (their low 64 bits, or the whole digest when the engine publishes
// bins).
type HashCheck struct {
	// Enabled turns the check on. Default off.
	Enabled bool
	// Seed is the engine's PYTHONHASHSEED.
	Seed string
	// Algo is the engine's prefix_caching_hash_algo: vllmhash.SHA256Pickle ("sha256",
	// the default) or vllmhash.SHA256CBOR ("sha256_cbor").
	Algo string
	// SampleEvery checks one chain root in SampleEvery, with the blocks stored under it.
	// Default 1 (all); 1..1e6.
	SampleEvery int
	// MaxTracked bounds the digests remembered so that blocks stored under a checked
	// block can be checked too (32 bytes + a map entry each); when full the memory is
	// dropped and later children count as unverifiable until new roots arrive. Default
	// 65536; 1..2^22.
	MaxTracked int
}

func (c HashCheck) withDefaults() HashCheck {
	if c.Algo == "" {
		c.Algo = vllmhash.SHA256Pickle
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = DefaultHashSample
	}
	if c.MaxTracked == 0 {
		c.MaxTracked = DefaultHashTracked
	}
	return c
}

func (c HashCheck) validate() error {
	switch {
	case c.Algo != vllmhash.SHA256Pickle && c.Algo != vllmhash.SHA256CBOR:
		return fmt.Errorf("HashCheck.Algo %q: want %q or %q (xxhash algorithms are not reproduced)", c.Algo, vllmhash.SHA256Pickle, vllmhash.SHA256CBOR)
	case c.SampleEvery < 1 || c.SampleEvery > 1_000_000:
		return fmt.Errorf("HashCheck.SampleEvery %d outside [1, 1000000]", c.SampleEvery)
	case c.MaxTracked < 1 || c.MaxTracked > maxHashTracked:
		return fmt.Errorf("HashCheck.MaxTracked %d outside [1, %d]", c.MaxTracked, maxHashTracked)
	}
	return nil
}

// GroupFilter selects the KV-cache groups of a hybrid model that are indexed. Only a
// group whose blocks hold the whole prefix (full attention) can serve a cached prefix;
// sliding-window and Mamba groups drop or summarise old tokens, and since vLLM publishes
// the same block hashes for every group, their removals would delete the full-attention
// group's blocks from the index. Events of other groups are counted
// (Status.Diag.SkippedGroups, Reason ReasonKVGroup) and never applied.
type GroupFilter struct {
	// Kinds lists the kv_cache_spec_kind values indexed. Default
	// {"full_attention", "mla_attention"}.
	Kinds []string
	// Groups, when not empty, lists the group_idx values indexed instead, whatever their
	// kind (for engines that publish group_idx without kv_cache_spec_kind).
	Groups []int
	// Hybrid indexes every group of a hybrid model under its kind's reuse rule instead
	// of selecting groups (Kinds and Groups must then be empty): the worker's groups are
	// declared to the index (engine.EventGroups), learned from its stored events'
	// group_idx, kv_cache_spec_kind, block_size and kv_cache_spec_sliding_window, and a
	// match is the longest cut every group accepts. See hybrid.go's comment for how a
	// group first seen late is handled. Needs Config.BlockSize, the index's unit.
	Hybrid bool
	// Declared, when not empty, is the model's declaration, group_idx i being
	// Declared[i] (block sizes in tokens, multiples of Config.BlockSize): nothing is
	// learned, and a worker restored from a snapshot with the same declaration keeps
	// its blocks. Implies Hybrid.
	Declared []engine.Group
}

// DefaultGroupKinds are the KV-cache spec kinds indexed by default.
func DefaultGroupKinds() []string { return []string{"full_attention", "mla_attention"} }

func (g GroupFilter) withDefaults() GroupFilter {
	g.Declared = slices.Clone(g.Declared)
	if len(g.Declared) > 0 {
		g.Hybrid = true
	}
	if len(g.Kinds) == 0 && !g.Hybrid {
		g.Kinds = DefaultGroupKinds()
	} else {
		g.Kinds = slices.Clone(g.Kinds)
	}
	g.Groups = slices.Clone(g.Groups)
	return g
}

func (g GroupFilter) validate(unit int) error {
	if g.Hybrid {
		switch {
		case len(g.Kinds) > 0 || len(g.Groups) > 0:
			return fmt.Errorf("Groups.Hybrid indexes every group by its kind's rule: Groups.Kinds and Groups.Groups select groups instead; set one or the other")
		case unit < 1:
			return fmt.Errorf("Groups.Hybrid needs BlockSize, the index's unit of blocks")
		}
		if len(g.Declared) > 0 {
			if err := engine.ValidateGroups(unit, g.Declared); err != nil {
				return fmt.Errorf("Groups.Declared: %w", err)
			}
		}
	}
	if len(g.Kinds) > 64 || len(g.Groups) > 1024 {
		return fmt.Errorf("Groups.Kinds, Groups.Groups: at most 64 kinds and 1024 group indices")
	}
	for _, x := range g.Groups {
		if x < 0 {
			return fmt.Errorf("Groups.Groups: negative group index %d", x)
		}
	}
	return nil
}

// GroupCount is one label of skipped KV-cache group events: the group's spec kind, or
// "group N" when its kind is unknown.
type GroupCount struct {
	Group string
	Count uint64
}

// HashCounts are the block-hash check's counters, in blocks.
type HashCounts struct {
	Matched      uint64 // recomputed hash equal to the published one
	Mismatched   uint64 // different: the engine hashed inputs it did not publish, or another seed or algorithm
	Unverifiable uint64 // parent digest unknown (stored under a block not checked), or extra keys not reproducible
	SampledOut   uint64 // not checked: their chain was not sampled
}

// Window counters (diagState.win): index of each quantity.
const (
	wStores = iota // stored events handed to the index
	wParentMiss
	wBlockSize // stores rejected for block_size
	wHashMatch
	wHashMismatch
	numWin
)

// window holds the counts of the current and the previous period.
type window struct {
	Start   time.Time // of the current period
	Cur     [numWin]uint64
	Prev    [numWin]uint64 // of the period before Start (zero if none was counted)
	HasPrev bool           // a period before Start has passed: Prev covers a whole one
}

// roll moves the window to the period holding now.
func (w *window) roll(now time.Time, period time.Duration) {
	if w.Start.IsZero() {
		w.Start = now
		return
	}
	el := now.Sub(w.Start)
	if el < period {
		return
	}
	if el < 2*period {
		w.Prev, w.HasPrev = w.Cur, true
		w.Start = w.Start.Add(period)
	} else { // a whole period or more passed without a count
		w.Prev, w.HasPrev = [numWin]uint64{}, true
		w.Start = now
	}
	w.Cur = [numWin]uint64{}
}

// Recent returns the counts of the last one to two periods as seen at now, and the span
// they cover.
func (w *window) Recent(now time.Time, period time.Duration) ([numWin]uint64, time.Duration) {
	c := *w
	c.roll(now, period)
	// After roll, now lies in the current period: the previous one ended at Start.
	out := c.Cur
	span := now.Sub(c.Start)
	if c.HasPrev {
		for i := range out {
			out[i] += c.Prev[i]
		}
		span += period
	}
	return out, span
}

// Diagnostics are a subscriber's diagnostic counters (Status.Diag).
type Diagnostics struct {
	// LiveSince is when the worker last became synced (live or stale) on its current
	// connection; zero while it is not.
	LiveSince time.Time
	// LastEvent is when an event of the worker was last applied (our clock); zero before.
	LastEvent time.Time
	// EventsSinceLive counts the events applied since the current connection began
	// (those of its catch-up replay included).
	EventsSinceLive uint64
	// LastServed is when the router last picked the worker (NoteServed); zero if never.
	LastServed time.Time
	// BlockSizes counts the stores rejected for their block_size, with the last such
	// size in ForeignBlockSize.
	BlockSizeRejects uint64
	ForeignBlockSize int
	// Hash is the block-hash check (zero when off); HashCheck reports whether it is on.
	Hash      HashCounts
	HashCheck bool
	// SkippedGroups counts the events of KV-cache groups not indexed, by group.
	SkippedGroups []GroupCount
	// Window holds the rates' recent counts.
	Window window
}

// learned is what a group's stored events said about it.
type learned struct {
	kind    string
	indexed bool
}

// diagState is the owner's side of the diagnostics.
type diagState struct {
	cfg    DiagnoseConfig
	groups GroupFilter
	kinds  map[string]bool
	gidx   map[int]bool
	learn  map[int]learned // group_idx -> kind, learned from stored events

	d     Diagnostics
	dirty bool // SkippedGroups changed since the last publish

	bsSeen uint64 // the decoder's cumulative block-size rejections already counted

	check    HashCheck
	pickle   bool // Algo is "sha256"
	hasher   vllmhash.Hasher
	root     vllmhash.Digest
	known    map[uint64]vllmhash.Digest // published hash -> digest of checked blocks
	rootSeen uint64
}

func newDiagState(cfg *Config) *diagState {
	ds := &diagState{cfg: cfg.Diagnose, groups: cfg.Groups, kinds: map[string]bool{}, learn: map[int]learned{}}
	for _, k := range cfg.Groups.Kinds {
		ds.kinds[k] = true
	}
	if len(cfg.Groups.Groups) > 0 {
		ds.gidx = map[int]bool{}
		for _, g := range cfg.Groups.Groups {
			ds.gidx[g] = true
		}
	}
	if cfg.HashCheck.Enabled {
		ds.check = cfg.HashCheck
		ds.pickle = cfg.HashCheck.Algo == vllmhash.SHA256Pickle
		ds.root = vllmhash.Root(cfg.HashCheck.Seed)
		if ds.pickle {
			ds.root = vllmhash.RootPickle(cfg.HashCheck.Seed)
		}
		ds.known = map[uint64]vllmhash.Digest{}
		ds.d.HashCheck = true
	}
	return ds
}

// indexed reports whether an event's KV-cache group is indexed, and the label to count
// it under when not. Events without group information (non-hybrid engines, older
// versions) are indexed.
func (ds *diagState) indexed(e *kvevents.Event) (bool, string) {
	if ds.gidx != nil {
		if !e.HasGroupIdx || ds.gidx[e.GroupIdx] {
			return true, ""
		}
		return false, groupLabel(e)
	}
	if e.SpecKind != "" {
		ok := ds.kinds[e.SpecKind]
		if _, seen := ds.learn[e.GroupIdx]; e.HasGroupIdx && (seen || len(ds.learn) < maxLearnedGroups) {
			ds.learn[e.GroupIdx] = learned{kind: e.SpecKind, indexed: ok}
		}
		return ok, e.SpecKind
	}
	if !e.HasGroupIdx {
		return true, ""
	}
	if l, known := ds.learn[e.GroupIdx]; known {
		return l.indexed, l.kind
	}
	// A group never seen with a kind: group 0 is the only group of a non-hybrid model.
	return e.GroupIdx == 0, groupLabel(e)
}

func groupLabel(e *kvevents.Event) string {
	if e.SpecKind != "" {
		return e.SpecKind
	}
	return "group " + strconv.Itoa(e.GroupIdx)
}

func (ds *diagState) skipGroup(label string) {
	ds.dirty = true
	for i := range ds.d.SkippedGroups {
		if ds.d.SkippedGroups[i].Group == label {
			ds.d.SkippedGroups[i].Count++
			return
		}
	}
	if len(ds.d.SkippedGroups) >= maxGroupKinds {
		label = "other"
		for i := range ds.d.SkippedGroups {
			if ds.d.SkippedGroups[i].Group == label {
				ds.d.SkippedGroups[i].Count++
				return
			}
		}
	}
	ds.d.SkippedGroups = append(ds.d.SkippedGroups, GroupCount{Group: label, Count: 1})
}

// batch counts the decoder's new block-size rejections of one batch.
func (ds *diagState) batch(b *kvevents.Batch, dec *kvevents.Decoder, now time.Time) {
	total := dec.Stats().Rejected[kvevents.ReasonBlockSizeMismatch]
	if total == ds.bsSeen {
		return
	}
	ds.d.Window.roll(now, ds.cfg.Window)
	ds.d.Window.Cur[wBlockSize] += total - ds.bsSeen
	ds.d.BlockSizeRejects += total - ds.bsSeen
	ds.bsSeen = total
	for _, r := range b.Rejected {
		if r.Reason == kvevents.ReasonBlockSizeMismatch {
			ds.d.ForeignBlockSize = r.BlockSize
		}
	}
}

// applied records an event handed to the index; parentMiss reports that the index
// rejected the store for its parent.
func (ds *diagState) applied(e *kvevents.Event, ok, parentMiss bool, now time.Time) {
	if ok {
		ds.d.LastEvent = now
		ds.d.EventsSinceLive++
	}
	if e.Kind != kvevents.Stored || e.HashOnly { // a copy has no parent to miss
		return
	}
	ds.d.Window.roll(now, ds.cfg.Window)
	ds.d.Window.Cur[wStores]++
	if parentMiss {
		ds.d.Window.Cur[wParentMiss]++
	}
}

// forget drops the checked digests of removed blocks (Removed) or of all (Cleared).
func (ds *diagState) forget(e *kvevents.Event) {
	if ds.known == nil {
		return
	}
	switch e.Kind {
	case kvevents.Removed:
		for _, s := range e.Seqs {
			delete(ds.known, s)
		}
	case kvevents.Cleared:
		clear(ds.known)
	}
}

// checkHashes recomputes a stored event's block hashes (see HashCheck). The event's
// Tokens and Digests are there: the decoder runs Verbatim when the check is on.
func (ds *diagState) checkHashes(e *kvevents.Event, now time.Time) {
	if ds.known == nil || e.Kind != kvevents.Stored || e.HashOnly { // no tokens to hash
		return
	}
	n := len(e.Seqs)
	c := &ds.d.Hash
	var parent vllmhash.Digest
	switch {
	case !e.HasParent:
		ds.rootSeen++
		if (ds.rootSeen-1)%uint64(ds.check.SampleEvery) != 0 {
			c.SampledOut += uint64(n)
			return
		}
		parent = ds.root
	case len(e.ParentDigest) == vllmhash.Size:
		copy(parent[:], e.ParentDigest)
	default:
		p, ok := ds.known[e.Parent]
		if !ok {
			c.Unverifiable += uint64(n)
			return
		}
		parent = p
	}
	whole := e.Digests != nil && e.DigestSize == vllmhash.Size
	bs := e.BlockSize
	ds.d.Window.roll(now, ds.cfg.Window) // once: every block of the event has its time
	for i := 0; i < n; i++ {
		var extra []byte
		if e.BlockExtras != nil {
			extra = e.BlockExtras[i]
			if extra != nil && len(extra) == 0 { // not reproducible
				c.Unverifiable += uint64(n - i)
				return
			}
		}
		var d vllmhash.Digest
		if ds.pickle {
			var err error
			if d, err = ds.hasher.BlockPickle(&parent, e.Tokens[i*bs:(i+1)*bs], extra); err != nil {
				c.Unverifiable += uint64(n - i)
				return
			}
		} else {
			d = ds.hasher.Block(&parent, e.Tokens[i*bs:(i+1)*bs], extra)
		}
		var ok bool
		if whole {
			ok = bytes.Equal(d[:], e.Digests[i*vllmhash.Size:(i+1)*vllmhash.Size])
		} else {
			ok = d.Low64() == e.Seqs[i]
		}
		if !ok {
			c.Mismatched++
			ds.d.Window.Cur[wHashMismatch]++
			c.Unverifiable += uint64(n - i - 1) // the chain below a mismatch cannot be had
			return
		}
		c.Matched++
		ds.d.Window.Cur[wHashMatch]++
		if len(ds.known) >= ds.check.MaxTracked {
			clear(ds.known)
		}
		ds.known[e.Seqs[i]] = d
		parent = d
	}
}

// publishInto refreshes the liveness fields for the state st is in and copies the
// diagnostics into st.Diag; the skipped-group list is cloned only when it changed.
func (ds *diagState) publishInto(st *Status, now time.Time) {
	// EventsSinceLive counts from the connection on, the catch-up replay included (the
	// history it brings proves the publisher works).
	switch st.State {
	case StateLive, StateStale:
		if ds.d.LiveSince.IsZero() {
			ds.d.LiveSince = now
		}
	case StateSyncing:
		ds.d.LiveSince = time.Time{}
	default:
		ds.d.LiveSince = time.Time{}
		ds.d.EventsSinceLive = 0
	}
	groups := st.Diag.SkippedGroups
	if ds.dirty {
		groups = slices.Clone(ds.d.SkippedGroups)
		ds.dirty = false
	}
	st.Diag = ds.d
	st.Diag.SkippedGroups = groups // LastServed is kept by publish, under the lock
}

// Problem is one diagnosed reason why routing may be ignoring the cache.
type Problem struct {
	// Code names the problem (see the package documentation): no_events,
	// events_stopped, block_size_mismatch, parent_not_found, hash_mismatch.
	Code string `json:"code"`
	// Message says what was seen, with figures; Hint what to do about it.
	Message string `json:"message"`
	Hint    string `json:"hint"`
}

// Problem codes.
const (
	ProblemNoEvents      = "no_events"
	ProblemEventsStopped = "events_stopped"
	ProblemBlockSize     = "block_size_mismatch"
	ProblemParentMiss    = "parent_not_found"
	ProblemHashMismatch  = "hash_mismatch"
)

// ProblemCodes lists every worker problem code, in a fixed order.
func ProblemCodes() []string {
	return []string{ProblemNoEvents, ProblemEventsStopped, ProblemBlockSize, ProblemParentMiss, ProblemHashMismatch}
}

// Problems diagnoses a status as of now; cfg is the subscriber's (Subscriber.Problems
// passes it). blockSize is the configured block size (0: any).
func Problems(st *Status, now time.Time, cfg DiagnoseConfig, blockSize int) []Problem {
	cfg = cfg.withDefaults()
	var out []Problem
	d := &st.Diag
	live := !d.LiveSince.IsZero() && (st.State == StateLive || st.State == StateStale)
	if live && cfg.NoEventsAfter > 0 && d.EventsSinceLive == 0 && now.Sub(d.LiveSince) >= cfg.NoEventsAfter {
		out = append(out, Problem{ProblemNoEvents,
			fmt.Sprintf("connected and synced for %s, no KV event received", roundDur(now.Sub(d.LiveSince))),
			"start the engine with KV events enabled (vLLM: --kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", ...}', prefix caching on); check the endpoint, port (+ data-parallel rank) and topic"})
	}
	if live && cfg.IdleAfter > 0 && !d.LastServed.IsZero() {
		since := d.LastEvent
		if since.Before(d.LiveSince) {
			since = d.LiveSince
		}
		if d.LastServed.Sub(since) > cfg.IdleAfter {
			out = append(out, Problem{ProblemEventsStopped,
				fmt.Sprintf("routed requests %s after its last KV event", roundDur(d.LastServed.Sub(since))),
				"the engine serves but publishes nothing: check that its publisher still runs (engine logs), that nothing between drops the PUB traffic, and the subscription topic"})
		}
	}
	recent, span := d.Window.Recent(now, cfg.Window)
	if recent[wBlockSize] > 0 {
		out = append(out, Problem{ProblemBlockSize,
			fmt.Sprintf("%d store(s) in the last %s had block_size %d, configured %d; they are not indexed", recent[wBlockSize], roundDur(span), d.ForeignBlockSize, blockSize),
			"set the engine's block_size in kvindex to the engine's --block-size (hybrid models: the full-attention group's block size)"})
	}
	stores := recent[wStores]
	if miss := recent[wParentMiss]; stores >= uint64(cfg.MinSamples) && float64(miss) >= cfg.ParentMissRate*float64(stores) && miss > 0 {
		out = append(out, Problem{ProblemParentMiss,
			fmt.Sprintf("%d of %d store(s) in the last %s (%.1f%%, %.2f/s) name a parent the worker does not hold", miss, stores, roundDur(span), 100*float64(miss)/float64(stores), float64(miss)/max(span.Seconds(), 1)),
			"the index missed part of the stream: check for gaps and replay failures (gaps, replay_failures), a second publisher on the same endpoint, or a data-parallel rank sent to the wrong port"})
	}
	if mm := recent[wHashMismatch]; mm > 0 {
		out = append(out, Problem{ProblemHashMismatch,
			fmt.Sprintf("%d of %d checked block(s) in the last %s have a block hash that does not follow from their tokens and extra keys", mm, mm+recent[wHashMatch], roundDur(span)),
			"the engine hashes inputs kvindex cannot see, or the check is misconfigured: the engine's prefix_caching_hash_algo and PYTHONHASHSEED must be the configured algo and seed; otherwise the events' tokens do not describe the cached blocks (tokenizer or template differences between router and engine show as queries that match nothing)"})
	}
	return out
}

func roundDur(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// Problems diagnoses the subscriber as of now.
func (s *Subscriber) Problems(now time.Time) []Problem {
	st := s.Status()
	return Problems(&st, now, s.cfg.Diagnose, s.cfg.BlockSize)
}

// NoteServed records that the router picked this worker at t (for events_stopped).
// Safe for concurrent use.
func (s *Subscriber) NoteServed(t time.Time) {
	s.mu.Lock()
	if t.After(s.pub.Diag.LastServed) {
		s.pub.Diag.LastServed = t
	}
	s.mu.Unlock()
}
