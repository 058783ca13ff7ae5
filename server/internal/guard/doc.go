// Package guard holds the enforcement half of serve's admission and access control:
// the mechanisms that decide, before a byte of a request is held, whether a client may
// hold it. It knows nothing of HTTP routes, gRPC services or metrics names; package
// server composes it (server/admit.go, server/auth.go) and counts what it refuses.
//
// What it owns:
//
//   - Budget: a byte budget taken and given back by many goroutines (lock-free).
//   - Shares: per-client budgets, created while a client holds bytes and dropped when
//     it holds none, so that one client (a source address) cannot take the whole
//     server budget (limits.client_in_flight_bytes, default half of it).
//   - Listener: connection slots, global and per source address, a bound on the
//     connections that have not authenticated yet, and a handshake window after which
//     a connection that has not authenticated a request is closed.
//   - BodyDeadline: the read deadline that enforces a minimum body rate.
//   - Tokens: bearer tokens as SHA-256 digests, compared in constant time.
//
// Who calls it: package server only (internal). Goroutines: Listener.Accept runs on the
// serving goroutine; a connection's handshake timer on the runtime's timer goroutine;
// Authenticated, Budget and Shares on request goroutines. Every type is safe for
// concurrent use; Listener's and Shares' maps are guarded by their mutex and hold one
// entry per open connection or per client with bytes in flight, so they are bounded by
// the connection limit.
//
// Numbers behind the defaults (server/admit.go documents them for users): a source
// address may hold 64 connections (a router keeps a pool of a few; 64 leaves room for a
// proxy's), the unauthenticated connections at most half the slots, the handshake
// window 10 s (a TLS handshake and the first request take milliseconds on a LAN; 10 s
// leaves room for a congested one), and a body must arrive at 64 KiB/s after a 2 s
// grace (a 1 MiB body in 18 s; a stalled one frees its reservation after the grace).
package guard
