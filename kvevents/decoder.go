package kvevents

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/kvindex/kvindex/hash"
)

// Errors Decode wraps (with %w) when a whole payload cannot be decoded. A payload that
// decodes may still have rejected events: see Batch.Rejected.
var (
	// ErrTruncated: the payload ends inside a value, or a header claims more elements or
	// bytes than remain.
	ErrTruncated = errors.New("kvevents: truncated payload")
	// ErrMalformed: the payload is not an EventBatch: invalid msgpack byte, a batch that is
	// not an array of 2 or more elements, events that are not an array, a ts or rank of the
	// wrong type, trailing bytes after the batch.
	ErrMalformed = errors.New("kvevents: malformed payload")
	// ErrLimit: the payload exceeds Limits.MaxPayloadBytes, MaxEvents or MaxDepth.
	ErrLimit = errors.New("kvevents: limit exceeded")
	// ErrConfig: New was given an invalid Config.
	ErrConfig = errors.New("kvevents: invalid config")
)

// Limits bound what one payload may make a Decoder do. Zero means the default.
type Limits struct {
	// MaxPayloadBytes is the largest payload Decode accepts. Default 16 MiB.
	MaxPayloadBytes int
	// MaxEvents is the largest events array a batch may declare. Default 262144.
	MaxEvents int
	// MaxBlocksPerEvent is the longest block_hashes an event may carry; a longer one
	// rejects the event (ReasonLimit). Default 131072.
	MaxBlocksPerEvent int
	// MaxTokensPerEvent is the longest token_ids a stored event may carry; a longer one
	// rejects the event (ReasonLimit). Default 2097152 (2^21).
	MaxTokensPerEvent int
	// MaxDepth is the deepest container nesting accepted, the batch array counting as 1
	// (events array 2, event 3, a field such as block_hashes 4, extra_keys entries 5 and
	// below). Deeper nesting fails the payload with ErrLimit; it bounds the recursion
	// that skips unknown values. Default 32, allowed 4..1024.
	MaxDepth int
}

// Default limits; see Limits.
const (
	DefaultMaxPayloadBytes   = 16 << 20
	DefaultMaxEvents         = 1 << 18
	DefaultMaxBlocksPerEvent = 1 << 17
	DefaultMaxTokensPerEvent = 1 << 21
	DefaultMaxDepth          = 32

	minDepth = 4
	maxDepth = 1024
)

// Config configures a Decoder. The zero Config is valid.
type Config struct {
	// BlockSize, when not zero, is the block size in tokens every stored event must
	// carry: the router's content hashes only match blocks cut at its own size, so an
	// event with another block_size is rejected (ReasonBlockSizeMismatch). Zero accepts
	// each event's own block_size. Must be 0 or within [1, hash.MaxBlockSize].
	BlockSize int
	// Limits bound each payload; zero fields take the defaults.
	Limits Limits
	// Verbatim keeps each stored event's token ids and published digests (Event.Tokens,
	// Event.Digests) for checks that recompute the engine's own block hashes. It costs a
	// copy of the token ids per event. Default false.
	Verbatim bool
	// HashOnly accepts stored events that name their blocks by engine hash only: empty
	// token_ids with one or more block_hashes, as vLLM's offloading connector publishes
	// for blocks it copied to CPU or storage (no tokens, no parent). They decode with
	// Event.HashOnly set and no Contents, and Config.BlockSize is not enforced on them
	// (the offloaded block size may be a multiple of the device's). Without HashOnly
	// such an event is rejected (ReasonTokenCountMismatch), as before. Default false:
	// a consumer must know that Contents may then be empty.
	HashOnly bool
	// Units, with BlockSize, accepts stored events whose block_size is a multiple of
	// BlockSize (at most MaxUnitsPerBlock of it): a hybrid model's KV-cache group with
	// larger blocks (a Mamba group of 64 tokens beside full attention of 16). Such a
	// block's Contents are its units' content hashes, block_size/BlockSize a block, so
	// that they match a router's hashes cut at BlockSize. A block of several units with
	// extra keys is rejected (ReasonBlockSizeMismatch): its keys name the block, not
	// its units. Default false.
	Units bool
}

// MaxUnitsPerBlock bounds a block's units under Config.Units.
const MaxUnitsPerBlock = 1 << 12

func (c Config) validate() error {
	if c.Units && c.BlockSize == 0 {
		return fmt.Errorf("%w: Units needs a BlockSize (the unit)", ErrConfig)
	}
	if c.BlockSize != 0 {
		if err := hash.CheckBlockSize(c.BlockSize); err != nil {
			return fmt.Errorf("%w: BlockSize: %w", ErrConfig, err)
		}
	}
	l := c.Limits
	for _, f := range []struct {
		name string
		v    int
	}{
		{"MaxPayloadBytes", l.MaxPayloadBytes},
		{"MaxEvents", l.MaxEvents},
		{"MaxBlocksPerEvent", l.MaxBlocksPerEvent},
		{"MaxTokensPerEvent", l.MaxTokensPerEvent},
		{"MaxDepth", l.MaxDepth},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: Limits.%s is negative (%d)", ErrConfig, f.name, f.v)
		}
	}
	if l.MaxDepth != 0 && (l.MaxDepth < minDepth || l.MaxDepth > maxDepth) {
		return fmt.Errorf("%w: Limits.MaxDepth %d outside [%d, %d]", ErrConfig, l.MaxDepth, minDepth, maxDepth)
	}
	return nil
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxPayloadBytes, DefaultMaxPayloadBytes)
	def(&l.MaxEvents, DefaultMaxEvents)
	def(&l.MaxBlocksPerEvent, DefaultMaxBlocksPerEvent)
	def(&l.MaxTokensPerEvent, DefaultMaxTokensPerEvent)
	def(&l.MaxDepth, DefaultMaxDepth)
	return l
}

// Interning bounds: Medium, SpecKind, Locality and Namespace strings repeat across events,
// so a Decoder keeps up to maxInterned of them (each at most maxInternLen bytes) and hands
// out the same string again without allocating. Past the bound it allocates.
const (
	maxInterned  = 4096
	maxInternLen = 256
)

// Decoder decodes payload frames. It is not safe for concurrent use: give each
// subscriber goroutine its own. The zero Decoder is ready to use with the zero Config.
type Decoder struct {
	cfg   Config // defaults applied
	ready bool
	stats Stats

	tokens  []uint32          // token_ids of the event being decoded
	scratch []byte            // namespace and number rendering
	idText  []byte            // a LoRA id in decimal, for the namespace
	intern  map[string]string // see maxInterned

	lora    []byte // the lora_name of the event being decoded
	keys    []byte // content keys of its blocks (extra.go)
	keyEnds []int  // where each block's key ends in keys
	rejBS   int    // block_size of a ReasonBlockSizeMismatch rejection, for its EventError
}

// New returns a Decoder for cfg. It never keeps a reference to cfg.
func New(cfg Config) (*Decoder, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Decoder{}
	d.setup(cfg)
	return d, nil
}

func (d *Decoder) setup(cfg Config) {
	cfg.Limits = cfg.Limits.withDefaults()
	d.cfg = cfg
	d.ready = true
}

// Stats returns the counters accumulated since the Decoder was made.
func (d *Decoder) Stats() Stats { return d.stats }

// Decode decodes one payload frame (the third ZMQ frame: a msgpack EventBatch) into
// into, overwriting it and reusing its memory. It returns an error wrapping ErrTruncated,
// ErrMalformed or ErrLimit when the payload as a whole cannot be decoded; into is then
// empty. Events that are well-formed msgpack but invalid are left out of into.Events and
// described in into.Rejected; events with an unknown type tag are counted in
// into.UnknownTypes. Neither is an error.
//
// Once into and the Decoder have grown to the sizes a workload needs, Decode does not
// allocate, except for the strings of a new EventError or of more than maxInterned
// distinct Medium/SpecKind/Locality/Namespace values.
func (d *Decoder) Decode(payload []byte, into *Batch) error {
	if !d.ready {
		d.setup(Config{})
	}
	if into == nil {
		return errors.New("kvevents: Decode into a nil Batch")
	}
	into.reset()
	var t tally
	err := d.decode(payload, into, &t)
	if err != nil {
		into.reset()
		d.stats.BadBatches++
		return err
	}
	d.stats.Batches++
	d.stats.UnknownTypes += uint64(into.UnknownTypes)
	for i, n := range t.rejected {
		d.stats.Rejected[i] += n
	}
	for i := range into.Events {
		switch into.Events[i].Kind {
		case Stored:
			d.stats.Stored++
		case Removed:
			d.stats.Removed++
		case Cleared:
			d.stats.Cleared++
		}
	}
	d.stats.Events += uint64(len(into.Events))
	return nil
}

type tally struct {
	rejected [NumReasons]uint64
}

func wireErr(e rerr, off int, what string) error {
	sentinel := ErrMalformed
	switch e {
	case rTrunc:
		sentinel = ErrTruncated
	case rDepth:
		sentinel = ErrLimit
	}
	return fmt.Errorf("%w: %s: %s at offset %d", sentinel, what, e, off)
}

// typeErr describes a value of the wrong kind at r.off.
func typeErr(r *reader, what, want string) error {
	k, e := r.peek()
	if e != rOK {
		return wireErr(e, r.off, what)
	}
	return fmt.Errorf("%w: %s is %s, want %s (offset %d)", ErrMalformed, what, k, want, r.off)
}

func (d *Decoder) decode(payload []byte, b *Batch, t *tally) error {
	lim := &d.cfg.Limits
	if len(payload) > lim.MaxPayloadBytes {
		return fmt.Errorf("%w: payload is %d bytes, limit %d", ErrLimit, len(payload), lim.MaxPayloadBytes)
	}
	r := reader{b: payload, maxDepth: lim.MaxDepth}

	// EventBatch: always an array_like struct, [ts, events] or [ts, events, rank, ...].
	n, e := r.arrayLen()
	if e == rType {
		return typeErr(&r, "batch", "array [ts, events, rank] (EventBatch is array_like in every vLLM and SGLang version)")
	}
	if e != rOK {
		return wireErr(e, r.off, "batch")
	}
	if n < 2 {
		return fmt.Errorf("%w: batch has %d elements, want at least 2 (ts, events)", ErrMalformed, n)
	}

	ts, e := r.number()
	if e == rType {
		return typeErr(&r, "ts", "float")
	}
	if e != rOK {
		return wireErr(e, r.off, "ts")
	}
	b.Timestamp = ts

	ne, e := r.arrayLen()
	if e == rType {
		return typeErr(&r, "events", "array")
	}
	if e != rOK {
		return wireErr(e, r.off, "events")
	}
	if ne > lim.MaxEvents {
		return fmt.Errorf("%w: batch declares %d events, limit %d", ErrLimit, ne, lim.MaxEvents)
	}
	for i := 0; i < ne; i++ {
		if err := d.event(&r, i, b, t); err != nil {
			return err
		}
	}

	if n >= 3 {
		if !r.nilNext() {
			rank, e := r.intIn(math.MinInt32, math.MaxInt32)
			switch e {
			case rOK:
				b.DPRank, b.HasDPRank = int(rank), true
			case rType:
				return typeErr(&r, "data_parallel_rank", "int or nil")
			default:
				return wireErr(e, r.off, "data_parallel_rank")
			}
		}
		// Elements past the rank (e.g. an unmerged publisher_id) are ignored.
		for i := 3; i < n; i++ {
			if e := r.skip(2); e != rOK {
				return wireErr(e, r.off, "batch element "+strconv.Itoa(i))
			}
		}
	}
	if r.off != len(payload) {
		return fmt.Errorf("%w: %d trailing bytes after the batch at offset %d", ErrMalformed, len(payload)-r.off, r.off)
	}
	if b.HasDPRank {
		for i := range b.Events {
			b.Events[i].DPRank, b.Events[i].HasDPRank = b.DPRank, true
		}
	}
	return nil
}

// field names a known event field.
type field uint8

const (
	fType field = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName // positional slot 7: lora_name (vLLM) or a BlockStoredMetadata map (SGLang)
	fExtraKeys
	fGroupIdx
	fSpecKind
	fLocality
	fCacheSalt
	fWindow
	numFields
	fNone = numFields
)

var fieldNames = [numFields]string{
	fType:        "type",
	fBlockHashes: "block_hashes",
	fParent:      "parent_block_hash",
	fTokenIDs:    "token_ids",
	fBlockSize:   "block_size",
	fLoraID:      "lora_id",
	fMedium:      "medium",
	fLoraName:    "lora_name",
	fExtraKeys:   "extra_keys",
	fGroupIdx:    "group_idx",
	fSpecKind:    "kv_cache_spec_kind",
	fLocality:    "locality",
	fCacheSalt:   "cache_salt",
	fWindow:      "kv_cache_spec_sliding_window",
}

func fieldByName(k []byte) field {
	switch string(k) {
	case "type":
		return fType
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoraID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoraName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "locality":
		return fLocality
	case "cache_salt":
		return fCacheSalt
	case "kv_cache_spec_sliding_window":
		return fWindow
	}
	return fNone
}

// Positional layouts (package documentation, "Wire format"): element i of an array event holds layout[i].
// Fields appended in later versions come last; elements past a layout are ignored, and
// elements a shorter (older) array lacks are absent.
var (
	storedLayout = [...]field{fType, fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID,
		fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fWindow}
	removedLayout = [...]field{fType, fBlockHashes, fMedium, fGroupIdx}
)

const (
	tagStored         = "BlockStored"
	tagStoredWithMeta = "BlockStoredWithMetadata" // SGLang PR #30827
	tagRemoved        = "BlockRemoved"
	tagCleared        = "AllBlocksCleared"
)

func layoutFor(tag []byte) []field {
	switch string(tag) {
	case tagStored, tagStoredWithMeta:
		return storedLayout[:]
	case tagRemoved:
		return removedLayout[:]
	}
	return nil // AllBlocksCleared has no fields; unknown tags are skipped whole
}

// Depth of values inside an event (the event itself is at depth 3).
const fieldDepth = 4

// event decodes the event at r.off. It returns an error only when the payload itself is
// broken (the event cannot be skipped); an invalid event is rejected and decoding goes on.
func (d *Decoder) event(r *reader, idx int, b *Batch, t *tally) error {
	var at [numFields]int
	for i := range at {
		at[i] = -1
	}
	var tag []byte
	badTag := ""
	dup := fNone

	k, e := r.peek()
	if e != rOK {
		return wireErr(e, r.off, "event "+strconv.Itoa(idx))
	}
	switch k {
	case kArray:
		n, e := r.arrayLen()
		if e != rOK {
			return wireErr(e, r.off, "event "+strconv.Itoa(idx))
		}
		if n == 0 {
			d.reject(b, t, idx, nil, ReasonMalformedEvent, "empty event array")
			return nil
		}
		if tk, _ := r.peek(); tk == kStr {
			tag, e = r.str()
		} else {
			badTag = "type tag (element 0) is " + tk.String() + ", want str"
			e = r.skip(fieldDepth)
		}
		if e != rOK {
			return wireErr(e, r.off, "event "+strconv.Itoa(idx)+" type tag")
		}
		layout := layoutFor(tag)
		for i := 1; i < n; i++ {
			if i < len(layout) {
				at[layout[i]] = r.off
			}
			if e := r.skip(fieldDepth); e != rOK {
				return wireErr(e, r.off, "event "+strconv.Itoa(idx)+" element "+strconv.Itoa(i))
			}
		}
	case kMap:
		n, e := r.mapLen()
		if e != rOK {
			return wireErr(e, r.off, "event "+strconv.Itoa(idx))
		}
		for i := 0; i < n; i++ {
			f := fNone
			if kk, _ := r.peek(); kk == kStr {
				var key []byte
				key, e = r.str()
				f = fieldByName(key)
			} else {
				e = r.skip(fieldDepth) // a non-string key is never a known field
			}
			if e != rOK {
				return wireErr(e, r.off, "event "+strconv.Itoa(idx)+" key")
			}
			if f != fNone {
				if at[f] >= 0 && dup == fNone {
					dup = f
				}
				at[f] = r.off
			}
			if e := r.skip(fieldDepth); e != rOK {
				return wireErr(e, r.off, "event "+strconv.Itoa(idx)+" value")
			}
		}
		if at[fType] < 0 {
			badTag = `no "type" key`
		} else {
			tr := reader{b: r.b, off: at[fType]}
			if tag, e = tr.str(); e != rOK {
				k, _ := tr.peek()
				badTag = `"type" is ` + k.String() + ", want str"
			}
		}
	default:
		if e := r.skip(3); e != rOK {
			return wireErr(e, r.off, "event "+strconv.Itoa(idx))
		}
		d.reject(b, t, idx, nil, ReasonMalformedEvent, "event is "+k.String()+", want array or map")
		return nil
	}
	if badTag != "" {
		d.reject(b, t, idx, nil, ReasonMalformedEvent, badTag)
		return nil
	}
	if dup != fNone {
		d.reject(b, t, idx, tag, ReasonDuplicateField, fieldNames[dup])
		return nil
	}

	var ev Event
	var reason Reason
	var detail string
	ok := true
	switch string(tag) {
	case tagStored, tagStoredWithMeta:
		ev.Kind = Stored
		reason, detail, ok = d.stored(&ev, r.b, &at, b)
	case tagRemoved:
		ev.Kind = Removed
		reason, detail, ok = d.removed(&ev, r.b, &at, b)
	case tagCleared:
		ev.Kind = Cleared
	default:
		b.UnknownTypes++
		return nil
	}
	if !ok {
		d.reject(b, t, idx, tag, reason, detail)
		return nil
	}
	b.Events = append(b.Events, ev)
	return nil
}

func (d *Decoder) reject(b *Batch, t *tally, idx int, tag []byte, reason Reason, detail string) {
	t.rejected[reason]++
	b.RejectedCount++
	switch string(tag) {
	case tagStored, tagStoredWithMeta:
	default:
		b.RejectedDrops++
	}
	bs := 0
	if reason == ReasonBlockSizeMismatch {
		bs, d.rejBS = d.rejBS, 0
	}
	if len(b.Rejected) < MaxRecordedRejections {
		b.Rejected = append(b.Rejected, EventError{Index: idx, Type: string(tag), Reason: reason, Detail: detail, BlockSize: bs})
	}
}

// at returns a reader positioned at field f, which the caller knows is present. The
// value was skipped once already, so only type and range errors remain possible.
func (d *Decoder) at(payload []byte, off int) reader {
	return reader{b: payload, off: off, maxDepth: d.cfg.Limits.MaxDepth}
}

func malformed(f field, r *reader, want string) (Reason, string, bool) {
	k, _ := r.peek()
	return ReasonMalformedField, fieldNames[f] + " is " + k.String() + ", want " + want, false
}

// stored fills ev from a BlockStored (or BlockStoredWithMetadata) event. On failure it
// leaves b's arenas as it found them.
func (d *Decoder) stored(ev *Event, payload []byte, at *[numFields]int, b *Batch) (Reason, string, bool) {
	lim := &d.cfg.Limits
	for _, f := range [...]field{fBlockHashes, fTokenIDs, fBlockSize} {
		if at[f] < 0 {
			return ReasonMissingField, fieldNames[f], false
		}
	}

	// block_size first: everything else is checked against it.
	r := d.at(payload, at[fBlockSize])
	bs64, e := r.intIn(math.MinInt64, math.MaxInt64)
	switch {
	case e == rType:
		return malformed(fBlockSize, &r, "int")
	case e == rRange || bs64 < 1 || bs64 > hash.MaxBlockSize:
		return ReasonBadBlockSize, "block_size out of [1, " + strconv.Itoa(hash.MaxBlockSize) + "]", false
	}
	bs := int(bs64)

	// token_ids: header only for now, so a mismatch costs no hashing.
	tr := d.at(payload, at[fTokenIDs])
	nt, e := tr.arrayLen()
	if e != rOK {
		return malformed(fTokenIDs, &tr, "array")
	}
	if nt > lim.MaxTokensPerEvent {
		return ReasonLimit, "token_ids has " + strconv.Itoa(nt) + " ids, limit " + strconv.Itoa(lim.MaxTokensPerEvent), false
	}
	// An empty token_ids is a hash-only store (Config.HashOnly) once block_hashes turns
	// out not to be empty; its block size names no content, so it is not checked.
	hashOnly := nt == 0 && d.cfg.HashOnly
	if !d.sizeFits(bs) && !hashOnly {
		return d.blockSizeMismatch(bs)
	}
	ev.BlockSize = bs

	if reason, detail, ok := d.optional(ev, payload, at, true); !ok {
		return reason, detail, false
	}

	if at[fParent] >= 0 {
		r := d.at(payload, at[fParent])
		if !r.nilNext() {
			p, e := r.blockHash()
			if e != rOK {
				return malformed(fParent, &r, "int, bin or nil")
			}
			ev.Parent, ev.HasParent = p, true
		}
	}

	seqStart, contentStart := len(b.seqs), len(b.contents)
	nb, reason, detail, ok := d.hashes(b, payload, at[fBlockHashes])
	if !ok {
		return reason, detail, false
	}
	if hashOnly && nb > 0 {
		ev.HashOnly = true
		ev.Seqs = b.seqs[seqStart:len(b.seqs):len(b.seqs)]
		ev.Contents = b.contents[contentStart:contentStart:contentStart]
		return 0, "", true
	}
	if !d.sizeFits(bs) { // an empty store of another size
		b.seqs = b.seqs[:seqStart]
		return d.blockSizeMismatch(bs)
	}
	if uint64(nt) != uint64(nb)*uint64(bs) {
		b.seqs = b.seqs[:seqStart]
		return ReasonTokenCountMismatch, "len(token_ids) = " + strconv.Itoa(nt) + ", want " + strconv.Itoa(nb) +
			" blocks × block_size " + strconv.Itoa(bs), false
	}

	d.tokens = slices.Grow(d.tokens[:0], nt)
	for i := 0; i < nt; i++ {
		if v, ok := tr.uint32Fast(); ok {
			d.tokens = append(d.tokens, v)
			continue
		}
		v, e := tr.intIn(0, math.MaxUint32)
		if e != rOK {
			b.seqs = b.seqs[:seqStart]
			k, _ := tr.peek()
			return ReasonMalformedField, "token_ids[" + strconv.Itoa(i) + "] is " + k.String() + describeRange(e) + ", want uint32", false
		}
		d.tokens = append(d.tokens, uint32(v))
	}
	keyed := false
	if ev.ExtraKeys && at[fExtraKeys] >= 0 && bs != d.cfg.BlockSize && d.cfg.Units {
		b.seqs = b.seqs[:seqStart]
		d.rejBS = bs
		return ReasonBlockSizeMismatch, "extra keys on blocks of " + strconv.Itoa(bs/d.cfg.BlockSize) + " units: they name the block, not its units", false
	}
	if ev.ExtraKeys && at[fExtraKeys] >= 0 {
		if reason, detail, ok := d.blockExtras(ev, b, payload, at[fExtraKeys], nb, d.lora); !ok {
			b.seqs = b.seqs[:seqStart]
			return reason, detail, false
		}
		keyed = true
	}
	d.contentsOf(b, bs, nb, keyed)
	if d.cfg.Verbatim {
		d.verbatim(ev, b, payload, at, nb)
	}
	ev.Seqs = b.seqs[seqStart:len(b.seqs):len(b.seqs)]
	ev.Contents = b.contents[contentStart:len(b.contents):len(b.contents)]
	return 0, "", true
}

// sizeFits reports whether a store of block size bs is accepted: any size without
// Config.BlockSize, that size, or under Config.Units a multiple of it.
func (d *Decoder) sizeFits(bs int) bool {
	u := d.cfg.BlockSize
	return u == 0 || bs == u || d.cfg.Units && bs%u == 0 && bs/u <= MaxUnitsPerBlock
}

// blockSizeMismatch rejects a store of block size bs (not Config.BlockSize), keeping bs
// for the rejection's EventError.BlockSize (see reject).
func (d *Decoder) blockSizeMismatch(bs int) (Reason, string, bool) {
	d.rejBS = bs
	return ReasonBlockSizeMismatch, "block_size " + strconv.Itoa(bs) + ", want " + strconv.Itoa(d.cfg.BlockSize), false
}

func describeRange(e rerr) string {
	if e == rRange {
		return " out of range"
	}
	return ""
}

// removed fills ev from a BlockRemoved event.
func (d *Decoder) removed(ev *Event, payload []byte, at *[numFields]int, b *Batch) (Reason, string, bool) {
	if at[fBlockHashes] < 0 {
		return ReasonMissingField, fieldNames[fBlockHashes], false
	}
	if reason, detail, ok := d.optional(ev, payload, at, false); !ok {
		return reason, detail, false
	}
	seqStart := len(b.seqs)
	if _, reason, detail, ok := d.hashes(b, payload, at[fBlockHashes]); !ok {
		return reason, detail, false
	}
	ev.Seqs = b.seqs[seqStart:len(b.seqs):len(b.seqs)]
	return 0, "", true
}

// hashes appends the block_hashes array at off to b.seqs and returns how many it
// appended. On failure b.seqs is unchanged.
func (d *Decoder) hashes(b *Batch, payload []byte, off int) (int, Reason, string, bool) {
	r := d.at(payload, off)
	n, e := r.arrayLen()
	if e != rOK {
		reason, detail, ok := malformed(fBlockHashes, &r, "array")
		return 0, reason, detail, ok
	}
	if n > d.cfg.Limits.MaxBlocksPerEvent {
		return 0, ReasonLimit, "block_hashes has " + strconv.Itoa(n) + " hashes, limit " +
			strconv.Itoa(d.cfg.Limits.MaxBlocksPerEvent), false
	}
	start := len(b.seqs)
	b.seqs = slices.Grow(b.seqs, n)
	for i := 0; i < n; i++ {
		h, e := r.blockHash()
		if e != rOK {
			b.seqs = b.seqs[:start]
			k, _ := r.peek()
			return 0, ReasonMalformedField, "block_hashes[" + strconv.Itoa(i) + "] is " + k.String() + ", want int or bin", false
		}
		b.seqs = append(b.seqs, h)
	}
	return n, 0, "", true
}

// optional decodes the optional fields: medium, group_idx and locality for every event,
// and for stores also kv_cache_spec_kind, extra_keys and the namespace inputs (lora_name,
// lora_id, cache_salt, SGLang's metadata map).
func (d *Decoder) optional(ev *Event, payload []byte, at *[numFields]int, store bool) (Reason, string, bool) {
	if off := at[fMedium]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			k, _ := r.peek()
			switch k {
			case kStr:
				s, _ := r.str()
				ev.Medium = d.str(s)
			case kInt: // an IntEnum medium, rendered in decimal
				bits, neg, _ := r.integer()
				ev.Medium = d.str(appendInt(d.scratch[:0], bits, neg))
			default:
				return malformed(fMedium, &r, "str, int or nil")
			}
		}
	}
	if off := at[fGroupIdx]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			g, e := r.intIn(math.MinInt32, math.MaxInt32)
			if e != rOK {
				return malformed(fGroupIdx, &r, "int32 or nil")
			}
			ev.GroupIdx, ev.HasGroupIdx = int(g), true
		}
	}
	if off := at[fLocality]; off >= 0 {
		s, reason, detail, ok := d.optStr(payload, off, fLocality)
		if !ok {
			return reason, detail, false
		}
		ev.Locality = d.str(s)
	}
	if !store {
		return 0, "", true
	}
	if off := at[fSpecKind]; off >= 0 {
		s, reason, detail, ok := d.optStr(payload, off, fSpecKind)
		if !ok {
			return reason, detail, false
		}
		ev.SpecKind = d.str(s)
	}
	if off := at[fWindow]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			w, e := r.intIn(0, math.MaxInt32)
			if e != rOK {
				return malformed(fWindow, &r, "int in [0, 2^31) or nil")
			}
			ev.SlidingWindow, ev.HasSlidingWindow = int(w), true
		}
	}
	if off := at[fExtraKeys]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			if n, e := r.arrayLen(); e == rOK {
				for i := 0; i < n && !ev.ExtraKeys; i++ {
					ev.ExtraKeys = !r.nilNext()
				}
			} else {
				ev.ExtraKeys = true // not the documented list, but not nil: keys exist
			}
		}
	}
	return d.namespace(ev, payload, at)
}

// optStr reads a str-or-nil field.
func (d *Decoder) optStr(payload []byte, off int, f field) ([]byte, Reason, string, bool) {
	r := d.at(payload, off)
	if r.nilNext() {
		return nil, 0, "", true
	}
	s, e := r.str()
	if e != rOK {
		reason, detail, ok := malformed(f, &r, "str or nil")
		return nil, reason, detail, ok
	}
	return s, 0, "", true
}

// namespace builds ev.Namespace from lora_name (or lora_id) and cache_salt; see the
// package documentation for the format.
func (d *Decoder) namespace(ev *Event, payload []byte, at *[numFields]int) (Reason, string, bool) {
	var name, salt []byte
	if off := at[fLoraName]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			k, _ := r.peek()
			switch k {
			case kStr:
				name, _ = r.str()
			case kMap: // SGLang BlockStoredMetadata {"cache_salt": ...} in slot 7
				n, _ := r.mapLen()
				for i := 0; i < n; i++ {
					f := fNone
					if kk, _ := r.peek(); kk == kStr {
						key, _ := r.str()
						f = fieldByName(key)
					} else {
						r.skip(fieldDepth + 1)
					}
					if f != fCacheSalt {
						r.skip(fieldDepth + 1)
						continue
					}
					if r.nilNext() {
						continue
					}
					s, e := r.str()
					if e != rOK {
						return malformed(fCacheSalt, &r, "str or nil")
					}
					salt = s
				}
			default:
				return malformed(fLoraName, &r, "str, nil or metadata map")
			}
		}
	}
	if off := at[fCacheSalt]; off >= 0 {
		s, reason, detail, ok := d.optStr(payload, off, fCacheSalt)
		if !ok {
			return reason, detail, false
		}
		if len(s) > 0 {
			salt = s
		}
	}
	var loraID uint64
	var loraNeg, hasLoraID bool
	if off := at[fLoraID]; off >= 0 {
		r := d.at(payload, off)
		if !r.nilNext() {
			var e rerr
			loraID, loraNeg, e = r.integer()
			if e != rOK {
				return malformed(fLoraID, &r, "int or nil")
			}
			hasLoraID = true
		}
	}

	d.lora = append(d.lora[:0], name...)
	var loraIDText []byte
	if len(name) == 0 && hasLoraID {
		loraIDText = appendInt(d.idText[:0], loraID, loraNeg)
		d.idText = loraIDText
	}
	buf := appendNamespace(d.scratch[:0], name, loraIDText, salt)
	d.scratch = buf
	ev.Namespace = d.str(buf)
	return 0, "", true
}

func appendInt(dst []byte, bits uint64, neg bool) []byte {
	if neg {
		return strconv.AppendInt(dst, int64(bits), 10)
	}
	return strconv.AppendUint(dst, bits, 10)
}

// AppendEscaped appends v with '%', ';' and control bytes (0x00-0x1f, 0x7f) written as
// %XX in upper-case hex: the escaping of every value in a namespace, which keeps the
// namespace format injective.
func AppendEscaped[T string | []byte](dst []byte, v T) []byte {
	const hexdigits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '%' || c == ';' || c < 0x20 || c == 0x7f {
			dst = append(dst, '%', hexdigits[c>>4], hexdigits[c&15])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// Namespace is the namespace of an event with this LoRA name and cache salt (see the
// package documentation; "" when both are empty): a router builds a query's namespace
// with it.
func Namespace(loraName, cacheSalt string) string {
	return string(appendNamespace(nil, []byte(loraName), nil, []byte(cacheSalt)))
}

// appendNamespace appends "lora=NAME" (or "lora_id=ID" when there is no name but an id
// in decimal) and "salt=SALT", joined by ';', each value escaped.
func appendNamespace(dst, name, loraID, salt []byte) []byte {
	switch {
	case len(name) > 0:
		dst = append(dst, "lora="...)
		dst = AppendEscaped(dst, name)
	case len(loraID) > 0:
		dst = append(dst, "lora_id="...)
		dst = append(dst, loraID...)
	}
	if len(salt) > 0 {
		if len(dst) > 0 {
			dst = append(dst, ';')
		}
		dst = append(dst, "salt="...)
		dst = AppendEscaped(dst, salt)
	}
	return dst
}

// str returns b as a string, from the intern table when it is there.
func (d *Decoder) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := d.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(b) <= maxInternLen && len(d.intern) < maxInterned {
		if d.intern == nil {
			d.intern = make(map[string]string)
		}
		d.intern[s] = s
	}
	return s
}
