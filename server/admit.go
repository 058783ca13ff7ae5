package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Admission: what a client can make serve hold is claimed before it is held. Every
// request that carries a body reserves, before a byte of it is read, the most the body
// may take (its Content-Length, else max_body_bytes; a gRPC call its max_message_bytes,
// which grpc-go allocates as soon as a message's length prefix declares it) from two
// budgets: its connection's (limits.conn_in_flight_bytes) and the server's, shared by
// HTTP and gRPC (limits.in_flight_bytes). A request the connection's budget cannot take
// is refused with 429 (RESOURCE_EXHAUSTED), one the server's cannot take with 503 and
// Retry-After (UNAVAILABLE over gRPC, for the client to retry elsewhere), at once and
// without reading it; the reservation is returned when the call ends. Connections are
// bounded too (limits.max_connections each for HTTP and gRPC): one past the bound is
// closed as soon as it is accepted. kvindex_requests_shed_total counts every refusal by
// API and reason, kvindex_in_flight_bytes is the server's reservation.
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
	// InFlightBytes is the server's budget of request bytes being received or held,
	// HTTP and gRPC together (see admit.go). Default 128 MiB; at least max_body_bytes
	// and, when grpc.listen is set, grpc.max_message_bytes; at most 64 GiB.
	InFlightBytes int64 `json:"in_flight_bytes,omitempty"`
	// ConnInFlightBytes is one connection's share: HTTP/2 and gRPC multiplex calls on
	// a connection. Default 16 MiB; at least what in_flight_bytes must hold, at most
	// in_flight_bytes.
	ConnInFlightBytes int64 `json:"conn_in_flight_bytes,omitempty"`
}

// Defaults and bounds of LimitsConfig.
const (
	DefaultMaxConnections    = 1024
	MaxMaxConnections        = 1 << 20
	DefaultInFlightBytes     = 128 << 20
	DefaultConnInFlightBytes = 16 << 20
	MaxInFlightBytes         = 64 << 30
)

func (l LimitsConfig) withDefaults() LimitsConfig {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.InFlightBytes == 0 {
		l.InFlightBytes = DefaultInFlightBytes
	}
	if l.ConnInFlightBytes == 0 {
		l.ConnInFlightBytes = min(DefaultConnInFlightBytes, l.InFlightBytes)
	}
	return l
}

// validate checks the limits against the largest request (body or gRPC message).
func (l LimitsConfig) validate(largest int64) error {
	l = l.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: limits.%s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case l.MaxConnections < 1 || l.MaxConnections > MaxMaxConnections:
		return bad("max_connections %d: want 1..%d", l.MaxConnections, MaxMaxConnections)
	case l.InFlightBytes < largest || l.InFlightBytes > MaxInFlightBytes:
		return bad("in_flight_bytes %d: want %d (the largest request: max_body_bytes, grpc.max_message_bytes) to %d", l.InFlightBytes, largest, int64(MaxInFlightBytes))
	case l.ConnInFlightBytes < largest || l.ConnInFlightBytes > l.InFlightBytes:
		return bad("conn_in_flight_bytes %d: want %d (the largest request) to in_flight_bytes (%d)", l.ConnInFlightBytes, largest, l.InFlightBytes)
	}
	return nil
}

// budget is a byte budget taken and given back by many goroutines.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes if they fit.
func (b *budget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *budget) give(n int64) { b.used.Add(-n) }

// Why a request was shed (kvindex_requests_shed_total's reason).
const (
	shedConnection  = "connection_budget" // its connection's in-flight bytes
	shedGlobal      = "server_budget"     // the server's in-flight bytes
	shedConnections = "connections"       // the connection limit
)

// admission holds the budgets and counts refusals.
type admission struct {
	limits LimitsConfig
	global budget
	shed   *prometheus.CounterVec // api, reason

	// grpcConns holds each gRPC connection's budget, by its peer address, while it
	// has calls in flight.
	mu        sync.Mutex
	grpcConns map[string]*connBudget
}

// connBudget is a connection's budget and, for gRPC, how many calls hold part of it.
type connBudget struct {
	budget
	calls int
}

func newAdmission(l LimitsConfig) *admission {
	a := &admission{limits: l.withDefaults(), grpcConns: map[string]*connBudget{}}
	a.global.limit = a.limits.InFlightBytes
	a.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindex_requests_shed_total",
		Help: "Requests refused before anything of them was read, by API (http, grpc) and reason (connection_budget, server_budget: in-flight bytes; connections: the connection limit).",
	}, []string{"api", "reason"})
	return a
}

// metrics returns the admission's collectors.
func (a *admission) metrics() []prometheus.Collector {
	return []prometheus.Collector{a.shed, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindex_in_flight_bytes",
		Help: "Request bytes reserved by calls in flight (HTTP bodies, gRPC messages), out of limits.in_flight_bytes.",
	}, func() float64 { return float64(a.global.used.Load()) })}
}

// reserve takes n bytes from conn and then from the server; the reason is "" when both
// took them.
func (a *admission) reserve(conn *budget, n int64) string {
	if !conn.take(n) {
		return shedConnection
	}
	if !a.global.take(n) {
		conn.give(n)
		return shedGlobal
	}
	return ""
}

func (a *admission) release(conn *budget, n int64) {
	a.global.give(n)
	conn.give(n)
}

// httpConnKey is the context key of an HTTP connection's budget.
type httpConnKey struct{}

// connContext gives each HTTP connection its budget (http.Server.ConnContext).
func (a *admission) connContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, httpConnKey{}, &budget{limit: a.limits.ConnInFlightBytes})
}

// httpHandler admits each request with a body before h reads it (see the comment at
// the top): the reservation is its Content-Length, or maxBody when the length is not
// declared or more (the handler reads no more than maxBody).
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
		conn, _ := r.Context().Value(httpConnKey{}).(*budget)
		if conn == nil {
			conn = &budget{limit: a.limits.ConnInFlightBytes} // a handler served without the server
		}
		switch a.reserve(conn, n) {
		case shedConnection:
			a.shed.WithLabelValues("http", shedConnection).Inc()
			writeError(w, http.StatusTooManyRequests, "too_many_in_flight", "this connection has %d request bytes in flight; limits.conn_in_flight_bytes is %d", conn.used.Load(), conn.limit)
			return
		case shedGlobal:
			a.shed.WithLabelValues("http", shedGlobal).Inc()
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "overloaded", "the server holds %d request bytes in flight; limits.in_flight_bytes is %d", a.global.used.Load(), a.global.limit)
			return
		}
		defer a.release(conn, n)
		h.ServeHTTP(w, r)
	})
}

// grpcReservation is what a gRPC call reserved, carried in its context from the tap
// handle to the end of the call.
type grpcReservation struct {
	addr string
	conn *connBudget
	n    int64
	done atomic.Bool
}

type grpcReservationKey struct{}

// grpcTap admits each gRPC call before grpc-go reads its message (grpc.InTapHandle),
// reserving n, the largest message it may carry.
func (a *admission) grpcTap(n int64) tap.ServerInHandle {
	return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		addr := ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		a.mu.Lock()
		cb := a.grpcConns[addr]
		if cb == nil {
			cb = &connBudget{budget: budget{limit: a.limits.ConnInFlightBytes}}
			a.grpcConns[addr] = cb
		}
		reason := a.reserve(&cb.budget, n)
		if reason == "" {
			cb.calls++
		} else if cb.calls == 0 {
			delete(a.grpcConns, addr)
		}
		a.mu.Unlock()
		switch reason {
		case shedConnection:
			a.shed.WithLabelValues("grpc", shedConnection).Inc()
			return nil, status.Errorf(codes.ResourceExhausted, "this connection has %d request bytes in flight; limits.conn_in_flight_bytes is %d", cb.used.Load(), cb.limit)
		case shedGlobal:
			a.shed.WithLabelValues("grpc", shedGlobal).Inc()
			return nil, status.Errorf(codes.Unavailable, "the server holds %d request bytes in flight; limits.in_flight_bytes is %d", a.global.used.Load(), a.global.limit)
		}
		return context.WithValue(ctx, grpcReservationKey{}, &grpcReservation{addr: addr, conn: cb, n: n}), nil
	}
}

// grpcRelease returns a unary call's reservation as soon as its handler returns, before
// grpc-go writes the response (grpc.UnaryInterceptor): the client may start its next
// call the moment it reads the answer, and that call must find this one's bytes free,
// or a client that keeps the advertised number of calls in flight is refused now and
// then. grpcStats returns the reservation of a call that never reached a handler.
func (a *admission) grpcRelease(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	a.releaseCall(ctx)
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
	g.a.releaseCall(ctx)
}

// releaseCall returns ctx's call reservation, once.
func (a *admission) releaseCall(ctx context.Context) {
	res, _ := ctx.Value(grpcReservationKey{}).(*grpcReservation)
	if res == nil || res.done.Swap(true) {
		return
	}
	a.mu.Lock()
	a.release(&res.conn.budget, res.n)
	if res.conn.calls--; res.conn.calls == 0 && a.grpcConns[res.addr] == res.conn {
		delete(a.grpcConns, res.addr)
	}
	a.mu.Unlock()
}
func (grpcStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (grpcStats) HandleConn(context.Context, stats.ConnStats)                       {}

// limitListener closes a connection accepted past max open ones, counting it.
type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	shed prometheus.Counter
}

func (a *admission) limit(ln net.Listener, api string) net.Listener {
	return &limitListener{Listener: ln, max: int64(a.limits.MaxConnections), shed: a.shed.WithLabelValues(api, shedConnections)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.shed.Inc()
			c.Close()
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its place back once, when closed.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
