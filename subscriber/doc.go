// Package subscriber follows the KV-cache event stream of one vLLM or SGLang publisher
// (one engine endpoint, one data-parallel rank) over ZeroMQ and applies it to the index
// under one worker id, so that the index never holds state it cannot vouch for.
//
// # First use
//
// One engine.Engine for the fleet; per inference engine (and data-parallel rank) a
// Config naming its endpoints, worker id, model and block size, New, and Run in a
// goroutine until the context ends. Queries name the namespace the events are applied
// in: engine.FindMatchesIn(ctx, Namespace(model, ""), content, dst). With a model
// configured, a plain FindMatches (the "" namespace) finds nothing. The Example runs
// all of it against a stand-in vLLM publisher.
//
// # What it owns
//
// For each publisher: a SUB socket (pure Go, github.com/go-zeromq/zmq4), a DEALER socket
// per replay request, a kvevents.Decoder, the sequence state (last applied sequence and
// a digest of its payload) and the worker's entries in the index. Nothing else writes
// that worker. The sockets' wire protocol is under "Wire protocol" below; package
// kvevents documents and decodes the payloads.
//
// # Who may call it
//
// New, then Run once in a goroutine of the caller's choosing; Run returns when its
// context ends. RunFor runs a group of subscribers for a set time, on goroutines of its
// own, and calls back before it stops them (`kvindex doctor`). Status, Synced and Wait (block until the first catch-up is done, woken
// by the owner: no polling) may be called from any goroutine at any time. Several
// Subscribers share one Index: *engine.Engine is safe for concurrent use and serialises
// each worker's events, and each Subscriber applies its worker's events as the owner of
// its state, in sequence order, so the events of one worker stay in order.
//
// The owner is whichever goroutine holds the subscriber's owner lock: Run's (the
// catch-up after connecting, socket errors, the timers) or a SUB connection's reader,
// which zmq4 runs per connection and which applies each live message itself, as the
// ZMTP guard reads it (zmtpguard.go, deliver): from the frame bytes to the index with
// one copy, into a buffer kept per connection, one decode, one ApplyBatch per batch
// when the Index has it (engine.Engine does), no allocation in steady state
// (TestLiveMessageZeroAlloc) and no goroutine hop. At most GOMAXPROCS-1 batches are
// decoded and applied at once in the process into an index that applies batches
// (applySlots), so one P always stays free of ingestion for a server's queries.
//
//	Run                                           SUB connection reader (zmq4's)
//	  open SUB: dial endpoint (or listen, Bind)     frames -> guard -> deliver (owner lock)
//	  catch-up: DEALER -> replay endpoint
//	  for each live [topic, seq, payload]:
//	    seq == next            apply
//	    seq >  next            gap: catch-up, then apply or invalidate
//	    seq <  next            duplicate (or, below where the connection began: verify
//	                           through a catch-up whether the publisher restarted)
//	  connection lost -> backoff, redial; unreachable for Grace -> RemoveWorker
//
// # Sequence numbers, gaps and replay
//
// Each publisher numbers its batches from 0; the 8-byte big-endian frame is parsed by
// kvevents.ParseSeq, and any other length (the unmerged 24-byte snapshot extension) is
// counted in Status.UnsupportedSeq and the message skipped, never guessed at.
//
// A catch-up asks the replay endpoint for every buffered batch from the last applied
// sequence on (from 0 when nothing was applied): [b"", start_seq] over a fresh DEALER,
// accepting both reply shapes, [b"", seq, payload] (vLLM before v0.26.0, SGLang) and
// [b"", topic, seq, payload] (vLLM v0.26.0+), up to the end marker (seq = 2^64-1, empty
// payload). The first reply must be the last applied batch, byte for byte (compared by
// an xxh3 digest): that proves the publisher is the one the index followed. Catch-ups run
// after every connection, on every gap in the live stream, and when a live sequence
// falls at or below where the current connection began.
//
// A restart (the engine process started over: its sequence went back to 0, its cache is
// empty) shows as a catch-up whose first reply is another batch, or that returns nothing
// where the last applied batch should be. The worker is then cleared and synced again
// from sequence 0, and stays exact. Without a replay endpoint, a live sequence at or
// below the connection's starting point is taken for a restart.
//
// A PUB drops what is past its high-water mark, and a gap shows only when the next
// batch arrives: so once the live stream has been quiet for Config.TailCheck (5 s)
// after a message, one catch-up fetches anything dropped at the end of the burst.
//
// A live gap's catch-up whose replay fails in transit (a timeout, a refused or reset
// connection) runs again, up to twice more, with backoff from ReconnectMin: after a
// stall every subscriber of a fleet replays at once, and the first attempts can time
// out behind the backlog. Config.Replays (a ReplayLimiter that serve shares among its
// subscribers) bounds the replays running at once; a replay's ReplayTimeout runs once
// it holds its slot.
//
// When a catch-up finds the missing range no longer buffered (vLLM keeps the last
// buffer_steps batches), or the replay fails for good, or a payload cannot be decoded, or the
// decoder rejects a removal: the worker is cleared and marked stale (StateStale). The
// batches after that point are applied as usual, so the index holds a subset of the
// worker's real blocks: scores may be low, never wrong. A stale worker becomes live again
// when the engine clears its cache (AllBlocksCleared), restarts, or a replay from
// sequence 0 succeeds (tried every ResyncInterval).
//
// # Connections
//
// Dial mode (the default) connects to the engine's bound PUB endpoint (vLLM's default
// tcp://*:5557); Bind mode listens for an engine that connects (vLLM connects when its
// endpoint names a host). zmq4 sockets make one dial attempt each; Run retries with
// exponential backoff and ±20% jitter between ReconnectMin and ReconnectMax. A publisher
// unreachable for longer than Grace has its worker removed from the index; when it comes
// back it is synced from scratch.
//
// A bound socket trusts whoever connects unless Config.AllowedPeers names the addresses
// that may; it holds at most eight connections, and when full a new one takes the place
// of the connection idle longest (two seconds at least), so idle connections cannot lock
// the real publisher out. ZMTP CURVE is not available (go-zeromq/zmq4 has the NULL and
// PLAIN mechanisms only): on an untrusted network prefer dial mode, where the subscriber
// chooses its peer, with the engine's port reachable by the routers only.
//
// # Hostile peers
//
// Anything that can reach an engine's PUB or replay port, or a bound endpoint, can talk
// to the subscriber, and zmq4 allocates each frame at its declared length (one header
// declaring 2^50 bytes panicked the process). Every socket therefore goes through the
// ZMTP guard (zmtpguard.go): a transport registered with zmq4 whose connections parse
// the stream as zmq4 reads it and refuse, before zmq4 sees it, a frame past
// Config.MaxMessageBytes (default 16 MiB, the decoder's payload limit; summed over a
// multi-part message), more than 16 frames in a message, a command over 64 KiB, a
// malformed greeting or READY, an incompatible socket type; a handshake is bounded by
// ReplayTimeout and a bound socket holds at most 8 connections. A refusal closes the
// connection, is logged once and counted (Status.PeersRefused); a refused live message
// invalidates the worker and a dialled peer is redialled with backoff. Memory is
// bounded by the cap per connection: a live message is read whole into the
// connection's buffer (kept between messages up to 64 KiB) and never reaches zmq4's
// queue; a replay reply, by the DEALER's 10-slot queue plus one.
//
// # Namespaces
//
// Events are applied in namespace Namespace(Model, event namespace):
// "model=" + MODEL + ";" + NS, where NS is kvevents' namespace ("" default, "lora=NAME",
// "salt=SALT", ...) and MODEL escapes '%', ';' and control bytes as %XX. So different
// models, and different adapters or salts of one model, never match each other; a query
// names its namespace the same way. With no model configured the namespace is NS alone.
//
// # Filters
//
// Each event's medium maps to a storage tier of the index (engine.Tier): DefaultTiers
// covers vLLM's and SGLang's names ("" and "GPU" device; "CPU", "CPU_TIER1",
// "CPU_PINNED" host; "STORAGE", "FS", "OBJ", "DISK", "CPU_TIER2", "EXTERNAL" disk),
// Config.Tiers adds or changes entries, Config.Media narrows what is accepted, and
// events of a medium without a tier are dropped (ReasonMedium). Every medium with a
// tier is indexed by default: the engine's Score then counts a worker's host and disk
// copies too (Match.Tiers tells them apart, Match.Weighted weighs them), which changes
// nothing for engines that do not offload; Media {"", "GPU"} keeps a device-only
// index. A stored event without token ids on a host or disk tier (vLLM's offloading
// connector: BlockStored(block_hashes, parent_block_hash=None, token_ids=[],
// medium="CPU")) is applied as engine.EventCopied: the worker now holds copies of the
// blocks it holds on another tier under those hashes (Status.Copied); one on the
// device tier names nothing the index can place and is dropped (ReasonHashOnly).
// Removals carry their medium's tier: vLLM removes a block per medium, and its copies
// on the other tiers stay. When the offloaded block size (the event's block_size) is a
// multiple of the device's, vLLM names each offloaded block by the hash of one of the
// device blocks it spans, so the index holds only that one on the slower tier: host
// and disk prefixes are then under-counted, never over-counted.
//
// A batch whose data-parallel rank differs from DPRank is skipped; stored events with extra_keys are
// indexed (their keys in the content hash) unless SkipExtraKeys; events of KV-cache
// groups the GroupFilter leaves out are skipped. Each skip is counted by Reason in Status.Rejected;
// decoder rejections by kvevents.Reason in Status.DecoderRejected.
//
// # Wire protocol
//
// vLLM (and SGLang) run, per data-parallel rank, a PUB socket and optionally a ROUTER
// replay socket, configured by vLLM's --kv-events-config {"endpoint", "replay_endpoint",
// "topic", "buffer_steps"}. Rank r uses the endpoints' port + r (OffsetEndpoint). The
// publisher binds when its endpoint has '*' (tcp://*:5557, the default) and connects
// otherwise, so a subscriber dials the former and binds for the latter (Bind).
//
//	live (PUB -> SUB)       [topic, seq, payload]
//	                        topic: the configured topic ("" by default); seq: 8 bytes,
//	                        unsigned big-endian, 0 for the first batch, +1 per batch;
//	                        payload: one msgpack EventBatch (package kvevents)
//	replay request          [b"", start_seq]          (DEALER -> ROUTER; 8 bytes BE)
//	replay reply, per batch [b"", seq, payload]       vLLM before v0.26.0, SGLang
//	                        [b"", topic, seq, payload] vLLM v0.26.0 and later
//	end of replay           the same shape with seq = ff ff ff ff ff ff ff ff and an
//	                        empty payload (and an empty topic)
//
// The ROUTER answers with every batch it still buffers (vLLM keeps the last
// buffer_steps batches, 10000 by default) from start_seq on, then the end marker; a
// request of any other shape is ignored by vLLM. For example, after batches 0..2 a
// request from 1 gets [b"", 00..01, payload1], [b"", 00..02, payload2], then
// [b"", ff..ff, b""] (each with the topic frame in vLLM v0.26.0+). PUB drops messages
// for a subscriber that is not connected yet, which is why every connection starts
// with a catch-up.
//
// # Diagnostics
//
// The owner counts what the silent-miss diagnostics need (diagnose.go) and publishes it
// in Status.Diag; Problems(status, now) turns it into problems, a pure function of
// counters and the clock: no_events (synced for DiagnoseConfig.NoEventsAfter without an
// event since the connection began), events_stopped (NoteServed reported a pick more
// than IdleAfter after the last event), block_size_mismatch (stores rejected for their
// block size in the last one to two Windows), parent_not_found (a fraction of recent
// stores over ParentMissRate) and hash_mismatch (HashCheck: vLLM's sha256 or
// sha256_cbor hashes recomputed from each chain's root with package vllmhash and compared with the
// published ones; the decoder then keeps tokens and digests, Config.Verbatim). The
// check remembers up to MaxTracked digests of checked blocks so that children stored in
// later events can be checked; removals and clears forget them.
//
// # Hybrid models
//
// GroupFilter indexes only the KV-cache groups that can serve a prefix: by
// kv_cache_spec_kind (full_attention, mla_attention by default) or by group_idx.
// Removals carry group_idx but no kind; a group's kind is learnt from its stores (an
// unknown group other than 0 is not indexed). Events of other groups are counted
// (ReasonKVGroup, Status.Diag.SkippedGroups) and never applied, because vLLM gives
// every group the same block hashes: a sliding-window group's removals would delete the
// full-attention blocks. testdata/hybrid-stream.hex is a recorded stream of such a
// model.
//
// GroupFilter.Hybrid indexes every group under its reuse rule instead (hybrid.go): the
// subscriber declares the worker's groups to the index (engine.EventGroups), from
// GroupFilter.Declared or learned from each batch's stores before its events are
// applied, and hands the index each group's events; the index scores the longest cut
// every group accepts. A model that proves dense is never declared. A group first seen
// after blocks are held redeclares, which drops them: the worker is invalidated until a
// resync from sequence 0 (Status.GroupDeclarations, Invalidations). Kinds the index has
// no rule for (cross attention, chunked local attention) are skipped and counted as
// above. TestHybridDifferential checks four model shapes, learned and declared, against
// the reference model.
//
// # Alternatives rejected
//
// Reading the payload's data_parallel_rank to route several ranks through one socket:
// ranks have their own sequence counters and ports, so one Subscriber per rank keeps
// gap detection exact. Trusting a reconnect without a replay: a publisher that restarted
// while the subscriber was away would leave its old blocks in the index forever. The
// libzmq cgo binding: a pure-Go build keeps cross-compiling (GOARCH=386) and the race
// detector simple. libzmq has ZMQ_MAXMSGSIZE, but receiving through it (goczmq, a
// throwaway program) measured no faster than zmq4 with the guard, and both are several
// times faster than decoding the payload (see DESIGN.md, "Hostile peers").
package subscriber
