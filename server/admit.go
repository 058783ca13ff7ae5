package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/kvindex/kvindex/server/internal/guard"
)

// Admission: what a client can make serve hold is claimed before it is held, and
// nothing is reserved for a client before it is authenticated (auth.go runs first: at
// the HTTP handler's start, in the gRPC transport's tap before admission).
//
// Every request that carries a body reserves, before a byte of it is read, the most the
// body may take (its Content-Length, else max_body_bytes; a gRPC call its
// max_message_bytes, which grpc-go allocates as soon as a message's length prefix
// declares it) from three budgets: its connection's (limits.conn_in_flight_bytes), its
// client's (limits.client_in_flight_bytes; a client is a source address) and the
// server's, shared by HTTP and gRPC (limits.in_flight_bytes). A request its connection
// or client cannot take is refused with 429 (RESOURCE_EXHAUSTED), one the server's
// cannot take with 503 and Retry-After (UNAVAILABLE over gRPC, for the client to retry
// elsewhere), at once and without reading it; the reservation is returned when the call
// ends. A body must arrive at limits.min_body_rate after limits.body_grace (and no read
// may stall longer than the grace), or its connection is closed and its reservation
// returned; a gRPC call ends after limits.call_timeout and a gRPC connection after
// limits.max_connection_age. The gRPC health service, open to probes, reserves from a
// budget of its own (4 × max_message_bytes), so that unauthenticated calls never take
// what authenticated ones need.
//
// Connections are bounded for HTTP and gRPC each (guard.Listener): limits.max_connections
// in all, limits.max_source_connections per source address, and
// limits.max_unauthenticated_connections that have not yet authenticated a request; a
// connection past a bound is closed as soon as it is accepted, and one that has not
// authenticated a request within limits.handshake_timeout is closed then.
// kvindex_requests_shed_total counts every refusal by API and reason,
// kvindex_in_flight_bytes is the server's reservation.
//
// Why reserve the bound rather than count bytes as they arrive: the memory is taken
// when the buffer is (a bytes.Buffer doubling under a slow body, grpc-go's message
// buffer), not when the bytes come; reserving the bound makes the budget an upper bound
// of that memory, which the memory formula (DESIGN.md, "Memory budget") adds up.

// LimitsConfig bounds what clients of the HTTP and gRPC APIs can make serve hold.
type LimitsConfig struct {
	// MaxConnections bounds the connections open at once, for HTTP and for gRPC each;
	// one past it is closed on accept. Default 1024, at most 1<<20.
	MaxConnections int `json:"max_connections,omitempty"`
	// MaxSourceConnections bounds the connections one source address (IP) may hold
	// open, for HTTP and gRPC each. Default 64, at most max_connections. Clients behind
	// one proxy or NAT share it.
	MaxSourceConnections int `json:"max_source_connections,omitempty"`
	// MaxUnauthenticatedConnections bounds the connections open that have not yet
	// authenticated a request, for HTTP and gRPC each. Default max_connections / 2, at
	// most max_connections.
	MaxUnauthenticatedConnections int `json:"max_unauthenticated_connections,omitempty"`
	// HandshakeTimeout closes a connection that has not authenticated a request (TLS
	// handshake, then a request with credentials) this long after it was accepted.
	// Default 10s, 10ms to 10m. A gRPC client that connects and waits longer before
	// its first call reconnects.
	HandshakeTimeout Duration `json:"handshake_timeout,omitempty"`
	// InFlightBytes is the server's budget of request bytes being received or held,
	// HTTP and gRPC together (see admit.go). Default 128 MiB; at least max_body_bytes
	// and, when grpc.listen is set, grpc.max_message_bytes; at most 64 GiB.
	InFlightBytes int64 `json:"in_flight_bytes,omitempty"`
	// ConnInFlightBytes is one connection's share: HTTP/2 and gRPC multiplex calls on
	// a connection. Default 16 MiB; at least what in_flight_bytes must hold, at most
	// in_flight_bytes.
	ConnInFlightBytes int64 `json:"conn_in_flight_bytes,omitempty"`
	// ClientInFlightBytes is one client's (source address's) share, over all its
	// connections. Default in_flight_bytes / 2 (at least conn_in_flight_bytes); at
	// least what in_flight_bytes must hold, at most in_flight_bytes.
	ClientInFlightBytes int64 `json:"client_in_flight_bytes,omitempty"`
	// MinBodyRate is the slowest a request body may arrive, in bytes a second, once
	// BodyGrace has passed. Default 65536 (a 1 MiB body in 18 s), at least 1.
	MinBodyRate int64 `json:"min_body_rate,omitempty"`
	// BodyGrace is the time a body has before MinBodyRate applies, and the longest one
	// read of it may wait. Default 2s, 10ms to 1m.
	BodyGrace Duration `json:"body_grace,omitempty"`
	// CallTimeout ends a gRPC call (its message's arrival and its answer) after this
	// long. Default 30s (as the HTTP read and write timeouts), 10ms to 10m.
	CallTimeout Duration `json:"call_timeout,omitempty"`
	// MaxConnectionAge closes a gRPC connection (after a 30 s grace for its calls) this
	// long after it opened; its client reconnects. Default 10m, 1s to 24h.
	MaxConnectionAge Duration `json:"max_connection_age,omitempty"`
}

// Defaults and bounds of LimitsConfig.
const (
	DefaultMaxConnections       = 1024
	MaxMaxConnections           = 1 << 20
	DefaultMaxSourceConnections = 64
	DefaultHandshakeTimeout     = 10 * time.Second
	DefaultInFlightBytes        = 128 << 20
	DefaultConnInFlightBytes    = 16 << 20
	MaxInFlightBytes            = 64 << 30
	DefaultMinBodyRate          = 64 << 10
	DefaultBodyGrace            = 2 * time.Second
	DefaultCallTimeout          = 30 * time.Second
	DefaultMaxConnectionAge     = 10 * time.Minute
	maxConnectionAgeGrace       = 30 * time.Second
	// probeMessages is how many largest messages the gRPC health service's own budget
	// holds.
	probeMessages = 4
)

func (l LimitsConfig) withDefaults() LimitsConfig {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxSourceConnections == 0 {
		l.MaxSourceConnections = min(DefaultMaxSourceConnections, l.MaxConnections)
	}
	if l.MaxUnauthenticatedConnections == 0 {
		l.MaxUnauthenticatedConnections = max(1, l.MaxConnections/2)
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = Duration(DefaultHandshakeTimeout)
	}
	if l.InFlightBytes == 0 {
		l.InFlightBytes = DefaultInFlightBytes
	}
	if l.ConnInFlightBytes == 0 {
		l.ConnInFlightBytes = min(DefaultConnInFlightBytes, l.InFlightBytes)
	}
	if l.ClientInFlightBytes == 0 {
		l.ClientInFlightBytes = min(max(l.InFlightBytes/2, l.ConnInFlightBytes), l.InFlightBytes)
	}
	if l.MinBodyRate == 0 {
		l.MinBodyRate = DefaultMinBodyRate
	}
	if l.BodyGrace == 0 {
		l.BodyGrace = Duration(DefaultBodyGrace)
	}
	if l.CallTimeout == 0 {
		l.CallTimeout = Duration(DefaultCallTimeout)
	}
	if l.MaxConnectionAge == 0 {
		l.MaxConnectionAge = Duration(DefaultMaxConnectionAge)
	}
	return l
}

// validate checks the limits against the largest request (body or gRPC message).
func (l LimitsConfig) validate(largest int64) error {
	l = l.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: limits.%s", ErrConfig, fmt.Sprintf(format, args...))
	}
	outside := func(d Duration, lo, hi time.Duration) bool { return time.Duration(d) < lo || time.Duration(d) > hi }
	switch {
	case l.MaxConnections < 1 || l.MaxConnections > MaxMaxConnections:
		return bad("max_connections %d: want 1..%d", l.MaxConnections, MaxMaxConnections)
	case l.MaxSourceConnections < 1 || l.MaxSourceConnections > l.MaxConnections:
		return bad("max_source_connections %d: want 1..max_connections (%d)", l.MaxSourceConnections, l.MaxConnections)
	case l.MaxUnauthenticatedConnections < 1 || l.MaxUnauthenticatedConnections > l.MaxConnections:
		return bad("max_unauthenticated_connections %d: want 1..max_connections (%d)", l.MaxUnauthenticatedConnections, l.MaxConnections)
	case outside(l.HandshakeTimeout, 10*time.Millisecond, 10*time.Minute):
		return bad("handshake_timeout %v: want 10ms..10m", time.Duration(l.HandshakeTimeout))
	case l.InFlightBytes < largest || l.InFlightBytes > MaxInFlightBytes:
		return bad("in_flight_bytes %d: want %d (the largest request: max_body_bytes, grpc.max_message_bytes) to %d", l.InFlightBytes, largest, int64(MaxInFlightBytes))
	case l.ConnInFlightBytes < largest || l.ConnInFlightBytes > l.InFlightBytes:
		return bad("conn_in_flight_bytes %d: want %d (the largest request) to in_flight_bytes (%d)", l.ConnInFlightBytes, largest, l.InFlightBytes)
	case l.ClientInFlightBytes < largest || l.ClientInFlightBytes > l.InFlightBytes:
		return bad("client_in_flight_bytes %d: want %d (the largest request) to in_flight_bytes (%d)", l.ClientInFlightBytes, largest, l.InFlightBytes)
	case l.MinBodyRate < 1:
		return bad("min_body_rate %d: want at least 1", l.MinBodyRate)
	case outside(l.BodyGrace, 10*time.Millisecond, time.Minute):
		return bad("body_grace %v: want 10ms..1m", time.Duration(l.BodyGrace))
	case outside(l.CallTimeout, 10*time.Millisecond, 10*time.Minute):
		return bad("call_timeout %v: want 10ms..10m", time.Duration(l.CallTimeout))
	case outside(l.MaxConnectionAge, time.Second, 24*time.Hour):
		return bad("max_connection_age %v: want 1s..24h", time.Duration(l.MaxConnectionAge))
	}
	return nil
}

// Why a request was shed (kvindex_requests_shed_total's reason); the connection
// listener's reasons are guard's.
const (
	shedConnection = "connection_budget" // its connection's in-flight bytes
	shedClient     = "client_budget"     // its client's in-flight bytes
	shedGlobal     = "server_budget"     // the server's in-flight bytes
	shedProbe      = "probe_budget"      // the health service's own budget
)

// admission holds the budgets and counts refusals.
type admission struct {
	limits  LimitsConfig
	global  *guard.Budget
	probe   *guard.Budget // the gRPC health service's calls
	clients *guard.Shares // by source address
	rate    guard.BodyRate
	shed    *prometheus.CounterVec // api, reason

	// The listeners, set by Start before it serves (nil for a handler served without
	// the server): requests mark their connections authenticated on them.
	httpLn, grpcLn *guard.Listener

	// grpcConns holds each gRPC connection's budget, by its peer address, while it
	// has calls in flight.
	mu        sync.Mutex
	grpcConns map[string]*connBudget
}

// connBudget is a gRPC connection's budget and how many calls hold part of it.
type connBudget struct {
	*guard.Budget
	calls int
}

func newAdmission(l LimitsConfig, largest int64) *admission {
	l = l.withDefaults()
	a := &admission{limits: l, grpcConns: map[string]*connBudget{},
		global:  guard.NewBudget(l.InFlightBytes),
		probe:   guard.NewBudget(probeMessages * largest),
		clients: guard.NewShares(l.ClientInFlightBytes),
		rate:    guard.BodyRate{MinRate: l.MinBodyRate, Grace: time.Duration(l.BodyGrace)},
	}
	a.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_requests_shed_total",
		Help: "Requests and connections refused before anything of them was read, by API (http, grpc) and reason (connection_budget, client_budget, server_budget, probe_budget: in-flight bytes; connections, source_connections, unauthenticated: a connection bound; handshake_timeout: no authenticated request in time).",
	}, []string{"api", "reason"})
	return a
}

// metrics returns the admission's collectors.
func (a *admission) metrics() []prometheus.Collector {
	return []prometheus.Collector{a.shed, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindex_in_flight_bytes",
		Help: "Request bytes reserved by calls in flight (HTTP bodies, gRPC messages), out of limits.in_flight_bytes.",
	}, func() float64 { return float64(a.global.Used()) })}
}

// reserve takes n bytes from conn, then the server, then client's share; the reason is
// "" when all took them.
func (a *admission) reserve(conn *guard.Budget, client string, n int64) string {
	if !conn.Take(n) {
		return shedConnection
	}
	if !a.global.Take(n) {
		conn.Give(n)
		return shedGlobal
	}
	if !a.clients.Take(client, n) {
		a.global.Give(n)
		conn.Give(n)
		return shedClient
	}
	return ""
}

func (a *admission) release(conn *guard.Budget, client string, n int64) {
	a.global.Give(n)
	a.clients.Give(client, n)
	conn.Give(n)
}

// httpConnKey is the context key of an HTTP connection's budget.
type httpConnKey struct{}

// connContext gives each HTTP connection its budget (http.Server.ConnContext).
func (a *admission) connContext(ctx context.Context, c net.Conn) context.Context {
	// The connection's source owns its requests until authentication names an
	// identity (requestid.go).
	ctx = withOwner(ctx, sourceOwner(c.RemoteAddr().String()))
	return context.WithValue(ctx, httpConnKey{}, guard.NewBudget(a.limits.ConnInFlightBytes))
}

// authenticated marks an HTTP request's connection as authenticated (auth.go calls it
// once the request's credentials are checked).
func (a *admission) authenticated(r *http.Request) {
	if a.httpLn != nil {
		a.httpLn.Authenticated(r.RemoteAddr)
	}
}

// httpHandler admits each request with a body before h reads it (see the comment at
// the top): the reservation is its Content-Length, or maxBody when the length is not
// declared or more (the handler reads no more than maxBody). The body is then read at
// limits.min_body_rate or not at all.
func (a *admission) httpHandler(h http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.ContentLength
		switch {
		case n == 0 || r.Body == nil || r.Body == http.NoBody:
			h.ServeHTTP(w, r)
			return
		case n < 0 || n > maxBody: // undeclared, or the handler refuses it past maxBody
			n = maxBody
		}
		conn, _ := r.Context().Value(httpConnKey{}).(*guard.Budget)
		if conn == nil {
			conn = guard.NewBudget(a.limits.ConnInFlightBytes) // a handler served without the server
		}
		client := guard.Source(r.RemoteAddr)
		switch reason := a.reserve(conn, client, n); reason {
		case shedConnection, shedClient:
			a.shed.WithLabelValues("http", reason).Inc()
			used, limit := conn.Used(), conn.Limit()
			what := "this connection has %d request bytes in flight; limits.conn_in_flight_bytes is %d"
			if reason == shedClient {
				used, limit = a.clients.Used(client), a.clients.Limit()
				what = "this client has %d request bytes in flight; limits.client_in_flight_bytes is %d"
			}
			writeError(w, http.StatusTooManyRequests, "too_many_in_flight", what, used, limit)
			return
		case shedGlobal:
			a.shed.WithLabelValues("http", shedGlobal).Inc()
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "overloaded", "the server holds %d request bytes in flight; limits.in_flight_bytes is %d", a.global.Used(), a.global.Limit())
			return
		}
		defer a.release(conn, client, n)
		rc := http.NewResponseController(w)
		r.Body = readCloser{a.rate.Reader(r.Body, rc.SetReadDeadline, time.Now), r.Body}
		h.ServeHTTP(w, r)
	})
}

// readCloser is a body read through a guard reader and closed as the request's.
type readCloser struct {
	r io.Reader
	c io.Closer
}

func (rc readCloser) Read(p []byte) (int, error) { return rc.r.Read(p) }
func (rc readCloser) Close() error               { return rc.c.Close() }

// grpcReservation is what a gRPC call reserved, carried in its context from the tap
// handle to the end of the call.
type grpcReservation struct {
	addr   string
	conn   *connBudget // nil for a health call, which holds the probe budget
	n      int64
	cancel context.CancelFunc // the call's limits.call_timeout
	done   atomic.Bool
}

type grpcReservationKey struct{}

// grpcTap authenticates each gRPC call and then admits it, before grpc-go reads its
// message (grpc.InTapHandle): a call without credentials is refused before anything is
// reserved for it; one with them marks its connection authenticated and reserves n,
// the largest message it may carry. Health calls (open to probes) reserve from the
// probe budget. Every call admitted ends after limits.call_timeout.
func (a *admission) grpcTap(n int64, acc *access) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		addr := ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		open := grpcOpenMethod(info.FullMethodName)
		if !open {
			if err := acc.grpcCheck(info.Header); err != nil {
				return nil, err
			}
			if a.grpcLn != nil {
				a.grpcLn.Authenticated(addr)
			}
		}
		res := &grpcReservation{addr: addr, n: n}
		if open {
			if !a.probe.Take(n) {
				a.shed.WithLabelValues("grpc", shedProbe).Inc()
				return nil, status.Errorf(codes.Unavailable, "the health service holds %d request bytes in flight, its budget", a.probe.Used())
			}
		} else if err := a.grpcReserve(res); err != nil {
			return nil, err
		}
		if !open {
			ctx = withOwner(ctx, acc.grpcOwner(ctx, addr, info.Header.Get("authorization")))
		}
		ctx, res.cancel = context.WithTimeout(ctx, time.Duration(a.limits.CallTimeout))
		return context.WithValue(ctx, grpcReservationKey{}, res), nil
	}
}

// grpcReserve reserves res.n for an authenticated call on its connection's, client's
// and the server's budgets.
func (a *admission) grpcReserve(res *grpcReservation) error {
	client := guard.Source(res.addr)
	a.mu.Lock()
	cb := a.grpcConns[res.addr]
	if cb == nil {
		cb = &connBudget{Budget: guard.NewBudget(a.limits.ConnInFlightBytes)}
		a.grpcConns[res.addr] = cb
	}
	reason := a.reserve(cb.Budget, client, res.n)
	if reason == "" {
		cb.calls++
	} else if cb.calls == 0 {
		delete(a.grpcConns, res.addr)
	}
	a.mu.Unlock()
	switch reason {
	case shedConnection:
		a.shed.WithLabelValues("grpc", shedConnection).Inc()
		return status.Errorf(codes.ResourceExhausted, "this connection has %d request bytes in flight; limits.conn_in_flight_bytes is %d", cb.Used(), cb.Limit())
	case shedClient:
		a.shed.WithLabelValues("grpc", shedClient).Inc()
		return status.Errorf(codes.ResourceExhausted, "this client has %d request bytes in flight; limits.client_in_flight_bytes is %d", a.clients.Used(client), a.clients.Limit())
	case shedGlobal:
		a.shed.WithLabelValues("grpc", shedGlobal).Inc()
		return status.Errorf(codes.Unavailable, "the server holds %d request bytes in flight; limits.in_flight_bytes is %d", a.global.Used(), a.global.Limit())
	}
	res.conn = cb
	return nil
}

// grpcOpenMethod reports whether a gRPC method is served without credentials.
func grpcOpenMethod(full string) bool { return strings.HasPrefix(full, "/grpc.health.v1.Health/") }

// grpcRelease returns a unary call's reservation as soon as its handler returns, before
// grpc-go writes the response (grpc.UnaryInterceptor): the client may start its next
// call the moment it reads the answer, and that call must find this one's bytes free,
// or a client that keeps the advertised number of calls in flight is refused now and
// then. grpcStats returns the reservation of a call that never reached a handler.
func (a *admission) grpcRelease(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	a.releaseCall(ctx, false)
	return resp, err
}

// grpcStreams is how many calls one gRPC connection may have in flight: the configured
// bound, at most the connection's budget over the largest message (at least one), so
// that a client that honours the advertised SETTINGS_MAX_CONCURRENT_STREAMS (grpc-go's
// does: it queues calls past it) is never refused for its connection's budget.
func (a *admission) grpcStreams(configured uint32, maxMessage int64) uint32 {
	return min(configured, uint32(min(max(1, a.limits.ConnInFlightBytes/maxMessage), int64(configured))))
}

// grpcStats returns a call's reservation when the call ends (grpc.StatsHandler).
type grpcStats struct{ a *admission }

func (grpcStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (g grpcStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, end := s.(*stats.End); !end {
		return
	}
	g.a.releaseCall(ctx, true)
}

// releaseCall returns ctx's call reservation, once; at the call's end (end) it also
// stops the call's timer.
func (a *admission) releaseCall(ctx context.Context, end bool) {
	res, _ := ctx.Value(grpcReservationKey{}).(*grpcReservation)
	if res == nil {
		return
	}
	if end {
		res.cancel()
	}
	if res.done.Swap(true) {
		return
	}
	if res.conn == nil {
		a.probe.Give(res.n)
		return
	}
	a.mu.Lock()
	a.release(res.conn.Budget, guard.Source(res.addr), res.n)
	if res.conn.calls--; res.conn.calls == 0 && a.grpcConns[res.addr] == res.conn {
		delete(a.grpcConns, res.addr)
	}
	a.mu.Unlock()
}
func (grpcStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (grpcStats) HandleConn(context.Context, stats.ConnStats)                       {}

// limit bounds ln's connections (guard.Listener), counting what it closes.
func (a *admission) limit(ln net.Listener, api string) *guard.Listener {
	return guard.NewListener(ln, guard.ListenerConfig{
		Max:             a.limits.MaxConnections,
		PerSource:       a.limits.MaxSourceConnections,
		Unauthenticated: a.limits.MaxUnauthenticatedConnections,
		Handshake:       time.Duration(a.limits.HandshakeTimeout),
		Shed:            func(reason string) { a.shed.WithLabelValues(api, reason).Inc() },
	})
}
