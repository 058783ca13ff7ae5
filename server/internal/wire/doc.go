// Package wire reads the JSON bodies of serve's HTTP queries: POST /v1/match (and
// /v1/route's match half) and POST /v1/routed, in one pass, into a Request whose slices
// are reused from one request to the next; the text fields of a text query (prompt,
// messages, tools, chat_template_kwargs) as raw, shape-checked JSON; and a request's
// per-block extra keys, bounded before they are decoded, into the content hashes vLLM
// computes for blocks with multimodal or salt keys.
//
// What it owns: the decoding only. Every semantic check (namespaces, weights, bounds
// against the server's configuration, the loads a pick carries) stays in package server,
// which is the only caller (internal). It holds no state and starts no goroutine; a
// Request belongs to the request goroutine that decodes into it.
//
// Numbers behind the design: encoding/json scans a body twice and decodes a token array
// element by element through reflection, about 0.2 ms for a 400-hash query and 1.1 ms
// for a 6,400-token one on a 2-core VM, most of a request's cost; the single pass is
// held to encoding/json's answers by server's FuzzDecodeMatch and FuzzDecodeRouted.
// Extra keys are bounded at 4,096 CBOR bytes per block and 8 levels of nesting, and the
// list's entries are counted and sized by a scan before any is decoded: decoding a 1 MiB
// hostile list whole cost about 0.4 s of CPU and 35 MB.
package wire
