package kvevents

import (
	"strconv"
)

// Kind is what an event does to a worker's blocks.
type Kind uint8

const (
	// Stored: blocks were added (vLLM/SGLang BlockStored, SGLang BlockStoredWithMetadata).
	Stored Kind = iota + 1
	// Removed: blocks were evicted (BlockRemoved).
	Removed
	// Cleared: every block was dropped (AllBlocksCleared).
	Cleared
)

func (k Kind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one decoded KV-cache event, neutral of the engine that sent it.
//
// Slices alias memory owned by the Batch the event was decoded into: they stay valid until
// that Batch is passed to Decode again. Copy them to keep them longer.
type Event struct {
	Kind Kind

	// Seqs are the engine's block hashes, in sequence order (Stored, Removed; empty for
	// Cleared). Integers are taken as uint64 (a negative one as its two's complement);
	// bin hashes are folded to their last 8 bytes, big-endian.
	Seqs []uint64

	// Contents (Stored only) holds the content hash of each block:
	// Contents[i] = hash.Content(token_ids[i*BlockSize : (i+1)*BlockSize]), so
	// len(Contents) == len(Seqs) (except for a HashOnly store, which has none). Under
	// Config.Units, a block larger than the unit has one content hash per unit, cut at
	// Config.BlockSize: len(Contents) == len(Seqs) * BlockSize / Config.BlockSize.
	Contents []uint64

	// HashOnly (Stored, with Config.HashOnly only) marks a store that names its blocks
	// by engine hash alone: token_ids was empty, so Contents is empty too (not
	// len(Seqs)) and BlockExtras, Tokens and Digests are nil. vLLM's offloading
	// connector publishes such stores for blocks copied to another medium.
	HashOnly bool

	// Parent is the engine hash of the block preceding Seqs[0] (Stored only); HasParent
	// is false when the first block starts a sequence (parent_block_hash nil or absent).
	Parent    uint64
	HasParent bool

	// BlockSize is the event's block_size in tokens (Stored only).
	BlockSize int

	// Namespace separates prefix spaces (Stored only): blocks stored for another LoRA
	// adapter or another cache salt never share a prefix with the default space even when
	// their tokens are equal. "" is the default space. See the package documentation for
	// the format.
	Namespace string

	// Medium is the cache tier ("GPU", "CPU", "STORAGE", SGLang's "CPU_TIER1", ...), ""
	// when nil or absent. An integer medium is rendered in decimal.
	Medium string

	// GroupIdx is the KV-cache group of a hybrid model (group_idx); HasGroupIdx is false
	// when nil or absent.
	GroupIdx    int
	HasGroupIdx bool

	// SpecKind is kv_cache_spec_kind ("full_attention", "sliding_window", ...), "" when
	// nil or absent (Stored only).
	SpecKind string

	// SlidingWindow is kv_cache_spec_sliding_window, a sliding-window group's window in
	// tokens (Stored only); HasSlidingWindow is false when nil or absent.
	SlidingWindow    int
	HasSlidingWindow bool

	// Locality is "LOCAL" or "REMOTE" (vLLM v0.26.0+), "" when nil or absent.
	Locality string

	// ExtraKeys (Stored only) is true when extra_keys held a non-nil entry: the engine
	// hashed inputs other than the tokens (multimodal data, LoRA name, salt) into some
	// block, so Contents alone under-describe those blocks.
	ExtraKeys bool

	// DPRank is the data-parallel rank of the batch (vLLM data_parallel_rank, SGLang
	// attn_dp_rank), copied into every event; HasDPRank is false when the batch had none.
	DPRank    int
	HasDPRank bool

	// BlockExtras (Stored, when extra_keys held a non-nil entry) has one element per
	// block: the block's extra_keys entry as canonical CBOR (the form vLLM hashes it in,
	// see package vllmhash), nil for a None entry, empty (not nil) for one holding values
	// whose CBOR is not reproduced (floats, maps). Blocks with extra keys other than the LoRA name have
	// a content hash that includes them (see extra.go).
	BlockExtras [][]byte

	// With Config.Verbatim only (Stored): Tokens are the event's token ids; Digests are
	// the block hashes as published, DigestSize bytes each, when every one is a bin
	// longer than 8 bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), with
	// ParentDigest the parent's (nil when there is none or it is not a bin of that size).
	// Digests is nil for int hashes.
	Tokens       []uint32
	Digests      []byte
	DigestSize   int
	ParentDigest []byte
}

// Batch is one decoded payload frame (an EventBatch). Decode overwrites it and reuses its
// memory: the Events, their slices and Rejected are valid until the Batch is passed to
// Decode again.
type Batch struct {
	// Timestamp is the batch's ts: Unix seconds as a float.
	Timestamp float64

	// Events are the accepted events, in wire order. Rejected and unknown events are not
	// here.
	Events []Event

	// DPRank is data_parallel_rank (vLLM) or attn_dp_rank (SGLang); HasDPRank is false
	// when it is nil or the batch has only two elements.
	DPRank    int
	HasDPRank bool

	// UnknownTypes counts events whose type tag this package does not know; they are
	// skipped, which is not an error.
	UnknownTypes int

	// RejectedCount counts events that were well-formed msgpack but not valid events
	// (Reason says why); Rejected details the first MaxRecordedRejections of them.
	RejectedCount int
	Rejected      []EventError
	// RejectedDrops counts the rejected events that were not stores (or whose type could
	// not be read): each may have removed or cleared blocks that the index will then
	// never hear of. Rejected stores only leave blocks out, which is safe.
	RejectedDrops int

	seqs       []uint64 // arena behind Events[i].Seqs
	contents   []uint64 // arena behind Events[i].Contents
	extras     [][]byte // arena behind Events[i].BlockExtras
	extraBytes []byte   // the bytes behind extras
	tokens     []uint32 // arena behind Events[i].Tokens
	digests    []byte   // arena behind Events[i].Digests and ParentDigest
}

// MaxRecordedRejections bounds Batch.Rejected, so a hostile batch of rejected events
// costs counters, not memory.
const MaxRecordedRejections = 16

func (b *Batch) reset() {
	b.Timestamp = 0
	b.Events = b.Events[:0]
	b.DPRank, b.HasDPRank = 0, false
	b.UnknownTypes = 0
	b.RejectedCount = 0
	b.RejectedDrops = 0
	b.Rejected = b.Rejected[:0]
	b.seqs = b.seqs[:0]
	b.contents = b.contents[:0]
	clear(b.extras) // drop references into old extraBytes arrays
	b.extras = b.extras[:0]
	b.extraBytes = b.extraBytes[:0]
	b.tokens = b.tokens[:0]
	b.digests = b.digests[:0]
}

// Reason says why an event was rejected.
type Reason uint8

const (
	// ReasonMalformedEvent: the event is neither an array nor a map, is an empty array,
	// or has no string type tag.
	ReasonMalformedEvent Reason = iota
	// ReasonMalformedField: a known field holds a value of the wrong type or range.
	ReasonMalformedField
	// ReasonMissingField: a required field (block_hashes; for stores also token_ids and
	// block_size) is absent.
	ReasonMissingField
	// ReasonDuplicateField: a map event names a known field twice.
	ReasonDuplicateField
	// ReasonBadBlockSize: block_size is outside [1, hash.MaxBlockSize].
	ReasonBadBlockSize
	// ReasonBlockSizeMismatch: block_size differs from Config.BlockSize.
	ReasonBlockSizeMismatch
	// ReasonTokenCountMismatch: len(token_ids) != len(block_hashes) * block_size.
	ReasonTokenCountMismatch
	// ReasonLimit: block_hashes or token_ids is longer than Limits allow.
	ReasonLimit

	// NumReasons is the number of reasons; Stats.Rejected is indexed by Reason.
	NumReasons
)

var reasonNames = [NumReasons]string{
	ReasonMalformedEvent:     "malformed event",
	ReasonMalformedField:     "malformed field",
	ReasonMissingField:       "missing field",
	ReasonDuplicateField:     "duplicate field",
	ReasonBadBlockSize:       "invalid block size",
	ReasonBlockSizeMismatch:  "block size mismatch",
	ReasonTokenCountMismatch: "token count mismatch",
	ReasonLimit:              "limit exceeded",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// EventError describes one rejected event. It is an error.
type EventError struct {
	Index  int    // position in the batch's events array
	Type   string // the event's type tag, "" when none could be read
	Reason Reason
	Detail string // which field and what was wrong with it
	// BlockSize is the event's block_size for ReasonBlockSizeMismatch, else 0.
	BlockSize int
}

func (e EventError) Error() string {
	s := "kvevents: event " + strconv.Itoa(e.Index)
	if e.Type != "" {
		s += " (" + strconv.Quote(e.Type) + ")"
	}
	s += ": " + e.Reason.String()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Stats are a Decoder's running counters. Events of a payload that fails to decode are
// not counted, only the failure.
type Stats struct {
	Batches      uint64 // payloads decoded
	BadBatches   uint64 // payloads Decode returned an error for
	Events       uint64 // accepted events, all kinds
	Stored       uint64 // accepted Stored events
	Removed      uint64 // accepted Removed events
	Cleared      uint64 // accepted Cleared events
	UnknownTypes uint64 // events skipped for an unknown type tag
	// Rejected counts rejected events by Reason.
	Rejected [NumReasons]uint64
}

// RejectedTotal is the sum of Rejected.
func (s Stats) RejectedTotal() uint64 {
	var t uint64
	for _, n := range s.Rejected {
		t += n
	}
	return t
}
