package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/kvindex/kvindex/route"
	"github.com/kvindex/kvindex/server/internal/guard"
)

// Request ids and who owns them. A request counted as routed ("pick": true, or POST
// /v1/routed with a request_id) is tracked under its owner and its id: the owner is
// the identity that authenticated the call (its client certificate, else its token),
// or its source address when serve runs without authentication. So a request can be
// finished only by the identity that created it (another's POST /v1/finished of the
// same id answers known: false), and two clients choosing the same id do not collide.
//
// What one owner may have tracked at once is bounded (clientTracking): requests in
// flight (routing.max_client_in_flight), the bytes of their ids
// (routing.max_client_id_bytes), and the blocks it counts against one worker
// (routing.max_client_worker_blocks), so that one client can neither take every
// tracking slot nor load one worker until no cost policy picks it. The tracker gives
// each share back when a request stops counting (finished, or its TTL).

// Bounds of the per-client tracking limits (RoutingConfig).
const (
	DefaultMaxClientInFlight     = 1 << 16
	DefaultMaxClientIDBytes      = 16 << 20
	DefaultMaxClientWorkerBlocks = 1 << 14
	// ownerBytes bounds an owner's name: "cert:" or "token:" and 16 hex digits, or
	// "source:" and an IP address (45 bytes for IPv6 with an IPv4 tail).
	ownerBytes = 64
	// clientEntryBytes is what one client's and one (client, worker) entry of
	// clientTracking hold (maps' share included), for the memory budget.
	clientEntryBytes = 2 * (ownerBytes + 96)
)

// newRequestID names a pick the caller did not name. The name is unguessable (128
// random bits): with sequential names (kvindex-1, kvindex-2, ...) any client could
// finish another's picks and so move load off the worker the picks went to.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return "kvindex-" + hex.EncodeToString(b[:])
}

// ownerKey is the context key of a call's owner.
type ownerKey struct{}

// withOwner records a call's owner in its context.
func withOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// ownerOf is the owner recorded for a call ("" when none: a library caller).
func ownerOf(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// digestOwner names an owner by a credential's digest (not the credential).
func digestOwner(kind string, b []byte) string {
	d := sha256.Sum256(b)
	return kind + hex.EncodeToString(d[:8])
}

// certOwner is the owner named by a verified client certificate ("" without one).
func certOwner(st *tls.ConnectionState) string {
	if st == nil || len(st.PeerCertificates) == 0 || len(st.VerifiedChains) == 0 {
		return ""
	}
	return digestOwner("cert:", st.PeerCertificates[0].Raw)
}

// tokenOwner is the owner named by an accepted bearer credential.
func tokenOwner(cred string) string {
	tok, _ := strings.CutPrefix(cred, "Bearer ")
	return digestOwner("token:", []byte(tok))
}

// sourceOwner is the owner of a call without credentials: its source address.
func sourceOwner(remote string) string { return "source:" + guard.Source(remote) }

// httpOwner is an authenticated HTTP request's owner; cred was accepted (or
// authentication is off).
func (acc *access) httpOwner(r *http.Request, cred string) string {
	if o := certOwner(r.TLS); o != "" {
		return o
	}
	if acc.tokens.Load() != nil {
		return tokenOwner(cred)
	}
	return sourceOwner(r.RemoteAddr)
}

// grpcOwner is an authenticated gRPC call's owner.
func (acc *access) grpcOwner(ctx context.Context, addr string, creds []string) string {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			if o := certOwner(&ti.State); o != "" {
				return o
			}
		}
	}
	if toks, admins := acc.tokens.Load(), acc.admin.Load(); toks != nil {
		for _, v := range creds {
			if toks.Bearer(v) || admins.Bearer(v) {
				return tokenOwner(v)
			}
		}
	}
	return sourceOwner(addr)
}

// trackKey is the tracker's key of owner's request id. A call without an owner (a
// library caller's) is keyed "\x01" and its id; owners start with a letter, and the
// load share's keys of the other replicas' requests with a NUL.
func trackKey(owner, id string) string {
	if owner == "" {
		return "\x01" + id
	}
	return owner + "\x00" + id
}

// ownerOfKey is a tracker key's owner ("" for a library caller's request or another
// replica's: neither is bounded per client).
func ownerOfKey(key string) string {
	if key == "" || key[0] < ' ' {
		return ""
	}
	o, _, _ := strings.Cut(key, "\x00")
	return o
}

// clientTracking bounds what each owner has tracked (see the comment at the top).
type clientTracking struct {
	maxInFlight, maxWorkerBlocks int64
	maxIDBytes                   int64

	mu      sync.Mutex
	clients map[string]*clientShare // guarded by mu: owners with requests in flight
	workers map[ownerWorker]int64   // guarded by mu: blocks by owner and worker, > 0
}

// clientShare is what one owner has in flight.
type clientShare struct {
	requests, idBytes int64
}

// ownerWorker keys one owner's blocks on one worker.
type ownerWorker struct{ owner, worker string }

// newClientTracking checks the limits of c (defaults for zeros).
func newClientTracking(c RoutingConfig) (*clientTracking, error) {
	t := &clientTracking{
		maxInFlight:     int64(orDefault(c.MaxClientInFlight, DefaultMaxClientInFlight)),
		maxIDBytes:      int64(orDefault(c.MaxClientIDBytes, DefaultMaxClientIDBytes)),
		maxWorkerBlocks: int64(orDefault(c.MaxClientWorkerBlocks, DefaultMaxClientWorkerBlocks)),
		clients:         map[string]*clientShare{},
		workers:         map[ownerWorker]int64{},
	}
	switch {
	case t.maxInFlight < 1 || t.maxInFlight > 1<<24:
		return nil, fmt.Errorf("%w: routing.max_client_in_flight %d: want 1..%d", ErrConfig, t.maxInFlight, 1<<24)
	case t.maxIDBytes < MaxRequestIDBytes+ownerBytes || t.maxIDBytes > 1<<32:
		return nil, fmt.Errorf("%w: routing.max_client_id_bytes %d: want %d..%d", ErrConfig, t.maxIDBytes, MaxRequestIDBytes+ownerBytes, int64(1<<32))
	case t.maxWorkerBlocks < 1 || t.maxWorkerBlocks > 1<<30:
		return nil, fmt.Errorf("%w: routing.max_client_worker_blocks %d: want 1..%d", ErrConfig, t.maxWorkerBlocks, 1<<30)
	}
	return t, nil
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// errClientBound is a refusal of clientTracking.take.
type errClientBound struct{ msg string }

func (e *errClientBound) Error() string { return e.msg }

// take counts one request of key (owner's), blocks against worker, or refuses it when
// one of owner's bounds is reached. Calls without an owner (a library caller) are not
// bounded here.
func (t *clientTracking) take(key, worker string, blocks int64) error {
	owner := ownerOfKey(key)
	if owner == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.clients[owner]
	if c == nil {
		c = &clientShare{}
	}
	ow := ownerWorker{owner, worker}
	switch {
	case c.requests+1 > t.maxInFlight:
		return &errClientBound{fmt.Sprintf("this client has %d requests tracked; routing.max_client_in_flight is %d", c.requests, t.maxInFlight)}
	case c.idBytes+int64(len(key)) > t.maxIDBytes:
		return &errClientBound{fmt.Sprintf("this client's tracked request ids hold %d bytes; routing.max_client_id_bytes is %d", c.idBytes, t.maxIDBytes)}
	case t.workers[ow]+blocks > t.maxWorkerBlocks:
		return &errClientBound{fmt.Sprintf("this client has %d blocks tracked on worker %q, this request %d more; routing.max_client_worker_blocks is %d",
			t.workers[ow], worker, blocks, t.maxWorkerBlocks)}
	}
	c.requests++
	c.idBytes += int64(len(key))
	t.clients[owner] = c
	t.workers[ow] += blocks
	return nil
}

// give returns what take counted for key; the tracker calls it (Tracker.OnDrop) when
// the request stops counting, and track when the tracker refused it.
func (t *clientTracking) give(key, worker string, blocks int64) {
	owner := ownerOfKey(key)
	if owner == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.clients[owner]
	if c == nil {
		return
	}
	if c.requests--; c.requests <= 0 {
		delete(t.clients, owner)
	} else {
		c.idBytes -= int64(len(key))
	}
	ow := ownerWorker{owner, worker}
	if n := t.workers[ow] - blocks; n > 0 {
		t.workers[ow] = n
	} else {
		delete(t.workers, ow)
	}
}

// routed tracks one request under key: the owner's shares first, then the tracker
// (which gives them back when the request stops counting), then the other replicas.
func (r *routing) routed(key, worker string, req route.Request, cached int) error {
	blocks := reqBlocks(req)
	if err := r.clients.take(key, worker, blocks); err != nil {
		return err
	}
	if err := r.tracker.Routed(key, worker, req, cached); err != nil {
		r.clients.give(key, worker, blocks)
		return err
	}
	r.share.routed(key, worker, req, cached)
	return nil
}

// reqBlocks is the blocks the tracker counts req by (route.Request's rule): its
// hashes, else its tokens in blocks.
func reqBlocks(req route.Request) int64 {
	if len(req.Blocks) > 0 || req.BlockSize <= 0 {
		return int64(len(req.Blocks))
	}
	return int64((req.Tokens + req.BlockSize - 1) / req.BlockSize)
}

// shareID is the id a tracked request has on the load share: its key's digest, of
// fixed length within fabric.MaxLoadName whatever the id's and owner's lengths.
func shareID(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:16])
}
