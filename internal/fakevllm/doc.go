// Package fakevllm is kvindex's fake vLLM engine, the one the daemon ships (`kvindex
// demo`), the load test drives (package bench/fleet, `kvindex loadtest`) and the tests
// play hostile peers with. It speaks the wire as vLLM does and nothing else: ZMTP 3.0 on
// raw TCP, msgpack KV-event batches (package kvevents decodes them; docs/engines.md
// describes them).
//
// # What it owns
//
//	Fleet ──── N engines ── PUB listener ── per subscriber: reader (subscriptions)
//	   │           │                       └─ writer (queued live messages)
//	   │           ├── ROUTER listener ─── per DEALER: replay replies from the ring
//	   │           └── block pool + requester (owned by one driver goroutine)
//	   └─ D driver goroutines (Drive): publish to their engines in turn at rate/D
//	      (DriveInBackground: one goroutine running Drive until stopped)
//
// Enc (msgpack.go) is the module's one msgpack encoder of vLLM batches: the engines'
// batches (payload.go), the decoders' test vectors and the hostile peers' payloads.
// Greeting, Ready, Message, LongHeader, Hostile, ServeHostile and Pub (peer.go) are
// ZMTP peers for tests: a real greeting, then whatever frames a test wants, checked by
// nothing.
//
// # Who may call it
//
// NewFleet, Drive (or DriveInBackground and its stop), Stall/Resume and Close for a
// fleet of one's own; Drive must not run twice at once; Counts between Drives. WantProbe, Probes, SamplePrompt and
// TakeReplayTime are the load test's view of what the drivers publish. Only the kvindex
// module imports it (internal/).
//
// # The engines
//
// An engine's PUB speaks ZMTP 3.0 (NULL mechanism) as libzmq does: it greets, sends
// READY (Socket-Type PUB), honours the subscriber's subscription messages (nothing
// goes to a connection before it subscribes, as a PUB filters), and queues live
// messages [topic, seq, payload] per connection up to FleetConfig.HWMBytes, dropping
// past it as a PUB at its high-water mark drops. Its ROUTER answers [b"", start_seq]
// with every buffered batch from start_seq on, [b"", topic, seq, payload] (vLLM
// v0.26.0's shape), then the end marker. Both are checked byte for byte by the
// subscriber's ZMTP guard, so a framing error here fails whoever drives it.
//
// Batches are vLLM's: one request per batch (a BlockRemoved of what its admission
// evicted, then a BlockStored of its new blocks with their token ids), in vLLM
// v0.26.0's map encoding by default (EncodingArray: the positional form of earlier
// releases). The block-pool model is in pool.go: multi-turn sessions over shared system
// prompts, LRU eviction of leaves, so caches fill and churn as a serving engine's do.
//
// # Alternatives rejected
//
// zmq4's own PUB and ROUTER sockets: a zmq4 socket runs goroutines and a 10-slot
// channel per connection and allocates each frame; 2,048 of them would cost the load
// generator as much CPU as serve on a 2-core machine. The Python test publisher
// (subscriber/pubtest): one process per fleet and a command round trip per batch top
// out near a thousand batches a second. Package sim's mock engine: it models routing,
// not the wire.
package fakevllm
