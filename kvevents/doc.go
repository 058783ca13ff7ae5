// Package kvevents decodes the KV-cache events that vLLM and SGLang publish over ZeroMQ
// into neutral Go values for the index.
//
// # First use
//
// New(Config{BlockSize: n}) once per publisher, a Batch reused for every payload, then
// Decode(payload, &batch) for each message and batch.Events to the index (the Example).
// Package subscriber does all of this for a router; use kvevents directly to decode
// events from another transport.
//
// # What it owns
//
// The bytes of one payload frame (the third frame of a [topic, seq, payload] message, a
// msgpack EventBatch) and the sequence frame (ParseSeq). Sockets, topics, replay requests,
// gap tracking and applying events to the index belong to the caller (package
// subscriber, whose documentation describes the sockets and the replay exchange). The
// wire format is described below, under "Wire format"; testdata/golden.txt holds its
// golden payloads, which the tests decode.
//
// # Who may call it
//
// A Decoder is not safe for concurrent use: each subscriber goroutine owns one Decoder
// and the Batch values it decodes into. Decode overwrites its Batch and reuses its memory,
// so the events and their slices are valid until that Batch is decoded into again; the
// owner copies what it keeps. Stats are read by the owner goroutine too.
//
//	ZMQ SUB goroutine (one per engine endpoint / DP rank)
//	  frames [topic, seq, payload]
//	    ParseSeq(seq)                    -> seq, gap check (caller)
//	    dec.Decode(payload, &batch)      -> batch.Events (Stored / Removed / Cleared)
//	    for ev := range batch.Events     -> index: stored(worker, ev.Parent?, zip(ev.Contents, ev.Seqs)) ...
//
// # What it accepts
//
//   - The batch: always a msgpack array (EventBatch is array_like in every version):
//     [ts, events] (vLLM <= v0.9) or [ts, events, rank] where rank is vLLM's
//     data_parallel_rank or SGLang's attn_dp_rank, an int32 or nil. Elements past the third
//     are ignored. ts may be float64, float32 or an integer. No version encodes the batch
//     as a map, so a map batch is ErrMalformed rather than a guess.
//   - Each event either positional (an array, type tag at [0], fields in declaration
//     order) or a map with a "type" key anywhere in it (vLLM after PR #42892, SGLang
//     after #37482), mixed freely within a batch. Known tags: BlockStored,
//     BlockStoredWithMetadata (SGLang #30827), BlockRemoved, AllBlocksCleared. Other tags
//     are counted (Batch.UnknownTypes, Stats.UnknownTypes) and skipped.
//   - Fields: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//     lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
//     locality, cache_salt. Unknown map keys (session_id, block_mm_infos, ...) and extra
//     trailing array elements are skipped; fields missing from a shorter (older) array or
//     omitted from a map (omit_defaults) are taken as nil.
//   - Positional slot 7 is vLLM's lora_name (str or nil) and, in SGLang's
//     BlockStoredWithMetadata, a metadata map {"cache_salt": ...}. The two are told apart
//     by msgpack type, whatever the tag.
//   - Block hashes: an integer of any width; a negative one (old vLLM's builtin hash())
//     is taken as its two's-complement uint64. A bin value
//     (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) is folded exactly as vLLM's
//     maybe_convert_block_hash does: int.from_bytes(b, "big") & (2^64-1), i.e. the last 8
//     bytes big-endian, a shorter one left-padded with zeros. A str hash is rejected: no
//     producer sends one, and folding the bytes of, say, a hex string would silently give
//     a wrong value.
//   - token_ids: every stored event must satisfy len(token_ids) == len(block_hashes) *
//     block_size (the engines emit full blocks only); otherwise the event is rejected
//     with ReasonTokenCountMismatch. Contents[i] is hash.Content of the i-th block of ids.
//     Except, with Config.HashOnly, an empty token_ids with block hashes: vLLM's
//     offloading connector names what it copied to CPU or storage by engine hash alone,
//     and such a store decodes with Event.HashOnly set and no Contents.
//
// # Valid payloads, rejected events
//
// Decode fails the whole payload (ErrTruncated, ErrMalformed, ErrLimit) only when it
// cannot be walked as an EventBatch, since then nothing after the fault can be located.
// An event that is well-formed msgpack but not a valid event (wrong field type, missing
// field, duplicate map key, bad block size, token count mismatch, over a per-event limit)
// is left out, counted per Reason in Stats.Rejected and described by an EventError in
// Batch.Rejected; the rest of the batch is decoded. Dropping a store is safe for the
// index (later children of its blocks are rejected as parent-not-found); failing the
// whole batch would drop its valid removals too.
//
// # Namespace
//
// A LoRA adapter or a cache salt changes the engine's block hashes without changing the
// tokens, so such blocks must not share a prefix with the default space. Event.Namespace
// names the space of a stored event, deterministically:
//
//	""                        no lora_name, no lora_id, no cache_salt (default space)
//	"lora=NAME"               lora_name (non-empty) is NAME
//	"lora_id=N"               no lora_name, lora_id is the integer N (deprecated field)
//	"salt=SALT"               cache_salt (non-empty) is SALT
//	"lora=NAME;salt=SALT"     both, always in this order (likewise "lora_id=N;salt=SALT")
//
// In NAME and SALT the bytes '%', ';', 0x00-0x1f and 0x7f are written as %XX (upper-case
// hex); all other bytes, UTF-8 included, are kept. So equal inputs give equal strings and
// different inputs different ones. An empty lora_name or cache_salt counts as absent, as
// the engines treat it. Removed and Cleared events name blocks by engine hash, which is
// unique within a worker whatever the namespace, so their Namespace is "".
//
// # Limits and memory
//
// Every count read from a msgpack header is checked against the bytes that remain (each
// element takes at least one byte) and against Limits before anything is sized by it, so
// a header that claims 2^32 elements costs nothing. Skipping unknown values recurses at
// most Limits.MaxDepth levels. Defaults:
//
//	MaxPayloadBytes   16 MiB   larger payloads fail with ErrLimit before any parsing
//	MaxEvents         262144   a larger events array fails the payload (ErrLimit)
//	MaxBlocksPerEvent 131072   a longer block_hashes rejects the event (ReasonLimit)
//	MaxTokensPerEvent 2^21     a longer token_ids rejects the event (ReasonLimit)
//	MaxDepth          32       deeper nesting fails the payload (ErrLimit); allowed 4..1024
//
// A Decoder's and a Batch's memory is therefore bounded by the payload: at most one Event
// per event and 16 bytes (engine hash + content hash) per block hash, each of which took
// at least one payload byte; one token buffer of at most MaxTokensPerEvent ids; at most
// MaxRecordedRejections EventErrors; and an intern table of at most 4096 strings of at
// most 256 bytes for Medium, SpecKind, Locality and Namespace values.
//
// # Allocation
//
// Decoding reuses the Batch's event slice and two arenas (engine hashes, content hashes)
// that the events' slices point into, the Decoder's token buffer and interned strings.
// Re-decoding a payload shape the Batch has seen allocates nothing (TestAllocs asserts
// 0). Rejections allocate their EventError strings.
//
// # Extra keys (multimodal prompts)
//
// extra_keys is vLLM's per-block list of the non-token inputs of each block's hash. A
// block whose entry holds more than the event's LoRA name gets the content hash
// hash.ContentExtra(tokens, CBOR(entry less the LoRA name)), so prompts whose image
// placeholder tokens are equal but whose images differ do not match; the LoRA name stays
// in the namespace. A router computes the same from the per-block extra keys it gives
// /v1/match (package server). A list whose length differs from block_hashes is rejected
// (ReasonMalformedField): its keys cannot be attributed to blocks. Event.BlockExtras keeps
// each entry as canonical CBOR for package vllmhash; Config.Verbatim also keeps the token
// ids and bin digests (Event.Tokens, Event.Digests) for the block-hash check.
//
// # Not decoded
//
// session_id. Hybrid models emit events per KV-cache group: GroupIdx, SpecKind,
// SlidingWindow and BlockSize are exposed and the caller chooses which groups to index
// and how (package subscriber's GroupFilter). Config.BlockSize rejects groups with
// another block size, and EventError.BlockSize says which; with Config.Units a group
// whose block size is a multiple of it is accepted and its blocks are cut into units.
//
// # Wire format
//
// What vLLM and SGLang publish, in the terms of the code above. A publisher (one per
// engine and data-parallel rank) sends ZeroMQ PUB messages of three frames:
//
//	topic    bytes, vLLM's KVEventsConfig.topic ("" by default: an empty frame); SUB filters
//	         on it as a prefix
//	seq      8 bytes, unsigned big-endian: 0 for the publisher's first batch, +1 per batch;
//	         each data-parallel rank counts on its own. 2^64-1 only ends a replay. Any
//	         other length (unmerged snapshot work makes it 24) is ErrSeqLength.
//	payload  one msgpack EventBatch, one per engine step that had events
//
// The EventBatch is a msgpack array: [ts, events] in vLLM up to v0.9, [ts, events, rank]
// since. ts is the publish time in Unix seconds (float64, tag cb); events is an array of
// events; rank is the data-parallel rank (int, or nil: the publisher fills it in). The
// encoder (msgspec) writes integers at their smallest width (fixint, cc, cd, ce, cf; d0-d3
// when negative), strings as fixstr/str8/16/32, byte strings as bin8/16/32.
//
// An event is either positional, an array whose element 0 is the type name and whose
// next elements are the fields in declaration order (every field present, nil when
// unset, so the array length is fixed per producer version), or a map from field name to
// value holding "type" plus the fields (fields equal to their default nil are left out,
// required ones present even when nil). vLLM wrote positional events until PR #42892
// (2026) and maps after it; SGLang switched with PR #37482; one batch may mix both. New
// fields are only ever appended, never reordered:
//
//	BlockStored     [1] block_hashes  [2] parent_block_hash  [3] token_ids  [4] block_size
//	                [5] lora_id  [6] medium (v0.11+)  [7] lora_name (v0.14+)
//	                [8] extra_keys (v0.17+)  [9] group_idx  [10] kv_cache_spec_kind
//	                [11] kv_cache_spec_sliding_window; maps may add locality, cache_salt,
//	                session_id
//	BlockRemoved    [1] block_hashes  [2] medium  [3] group_idx; maps may add locality
//	AllBlocksCleared  the type alone
//
// block_hashes are the engine's own hashes of the full blocks, in sequence order;
// parent_block_hash is the hash of the block before block_hashes[0], nil when the first
// block starts the sequence; token_ids are all the event's tokens, len(block_hashes) *
// block_size of them; medium is "GPU" for the GPU pool ("CPU", "STORAGE", ... for
// offload tiers); lora_name (or the older integer lora_id) names the adapter; extra_keys
// is, per block, nil or the other inputs to its hash (multimodal items, salts); group_idx
// and kv_cache_spec_kind name the KV-cache group of hybrid models. SGLang's positional
// BlockStored stops at [6]; its BlockStoredWithMetadata adds [7] = {"cache_salt": SALT}.
// A block hash is an unsigned integer by default, a negative one from very old vLLM, or,
// with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, the 32-byte digest as bin (its last 8 bytes
// big-endian are the integer the default mode sends).
//
// Golden payload A1 of testdata/golden.txt, a positional BlockStored, byte by byte:
//
//	93                          batch: array of 3
//	cb 41da13b860100000           ts float64 1750000000.25
//	91                            events: array of 1
//	98                              event: array of 8 (type + 7 fields)
//	ab 426c6f636b53746f726564         "BlockStored"
//	92 cf 8899aabbccddeeff            block_hashes [0x8899aabbccddeeff,
//	   cf 0102030405060708                          0x0102030405060708]
//	cf 1122334455667788               parent_block_hash 0x1122334455667788
//	98 ce 0002505c cd 0368 cc c6      token_ids [151644, 872, 198,
//	   cd 2368 cd 0176 cd 0117           9064, 374, 279,
//	   cd 1a42 cd 013b                   6722, 315]
//	04                                block_size 4
//	c0                                lora_id nil
//	a3 475055                         medium "GPU"
//	c0                                lora_name nil
//	00                            rank 0
//
// Decoded: one Stored event, Seqs [0x8899aabbccddeeff 0x0102030405060708], Parent
// 0x1122334455667788, Contents the hash.Content of [151644 872 198 9064] and of
// [374 279 6722 315]. The other payloads there: A2 and A3 (positional BlockRemoved and
// AllBlocksCleared), the v0.9 and v0.11 layouts of A1, C1 (the 12-field layout), B1-B3
// (the same events as maps), a nil rank, and a bin block hash.
package kvevents
