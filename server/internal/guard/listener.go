package guard

import (
	"net"
	"sync"
	"time"
)

// Why the Listener closed a connection (the shed callback's reason).
const (
	ShedConnections       = "connections"        // every slot is taken
	ShedSourceConnections = "source_connections" // its source address holds its slots
	ShedUnauthenticated   = "unauthenticated"    // the slots for unauthenticated connections are taken
	ShedHandshake         = "handshake_timeout"  // no authenticated request within the window
)

// ListenerConfig bounds a Listener. Every field must be positive.
type ListenerConfig struct {
	// Max is the connections open at once.
	Max int
	// PerSource is the connections one source address (IP) may hold.
	PerSource int
	// Unauthenticated is the connections open at once that have not authenticated a
	// request yet.
	Unauthenticated int
	// Handshake is how long a connection may stay open without authenticating a
	// request (the TLS handshake and the first request's credentials).
	Handshake time.Duration
	// Shed, when set, is told of every connection the listener closes, with the reason.
	Shed func(reason string)
}

// Listener bounds the connections it accepts (see ListenerConfig): a connection past a
// bound is closed as soon as it is accepted, and one that has not authenticated a
// request (Authenticated) within the handshake window is closed then.
type Listener struct {
	net.Listener
	cfg ListenerConfig

	mu       sync.Mutex
	open     int
	pending  int            // open and not yet authenticated
	bySource map[string]int // open connections per source IP
	byAddr   map[string]*Conn
}

// NewListener bounds ln's connections by cfg.
func NewListener(ln net.Listener, cfg ListenerConfig) *Listener {
	return &Listener{Listener: ln, cfg: cfg, bySource: map[string]int{}, byAddr: map[string]*Conn{}}
}

// Source is the part of a remote address that identifies a client: its IP, or the
// whole address when it has no port (a Unix socket's).
func Source(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// Accept returns the next connection within the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// admit counts c in, or closes it and returns nil.
func (l *Listener) admit(c net.Conn) *Conn {
	addr := c.RemoteAddr().String()
	src := Source(addr)
	l.mu.Lock()
	reason := ""
	switch {
	case l.open >= l.cfg.Max:
		reason = ShedConnections
	case l.bySource[src] >= l.cfg.PerSource:
		reason = ShedSourceConnections
	case l.pending >= l.cfg.Unauthenticated:
		reason = ShedUnauthenticated
	}
	if reason != "" {
		l.mu.Unlock()
		l.shed(reason)
		c.Close()
		return nil
	}
	gc := &Conn{Conn: c, l: l, addr: addr, src: src}
	l.open++
	l.pending++
	l.bySource[src]++
	l.byAddr[addr] = gc
	gc.timer = time.AfterFunc(l.cfg.Handshake, gc.expire)
	l.mu.Unlock()
	return gc
}

func (l *Listener) shed(reason string) {
	if l.cfg.Shed != nil {
		l.cfg.Shed(reason)
	}
}

// Authenticated marks the open connection from remote (a request's RemoteAddr) as
// having authenticated a request: the handshake window no longer applies to it. It
// reports whether the listener holds such a connection.
func (l *Listener) Authenticated(remote string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.byAddr[remote]
	if c == nil {
		return false
	}
	if !c.authed && !c.expired {
		c.authed = true
		l.pending--
		c.timer.Stop()
	}
	return c.authed
}

// Open is the connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Conn is a connection the Listener accepted; Close gives its slots back.
type Conn struct {
	net.Conn
	l    *Listener
	addr string
	src  string
	once sync.Once
	// Guarded by l.mu: the handshake timer, and whether the connection authenticated
	// a request or outlived the window first (one of them, for good).
	timer   *time.Timer
	authed  bool
	expired bool
}

// expire closes the connection if it has not authenticated (the handshake timer).
func (c *Conn) expire() {
	c.l.mu.Lock()
	expired := !c.authed
	c.expired = expired
	c.l.mu.Unlock()
	if !expired {
		return
	}
	c.l.shed(ShedHandshake)
	c.Close()
}

// Close closes the connection and gives its slots back, once.
func (c *Conn) Close() error {
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		c.timer.Stop()
		l.open--
		if !c.authed {
			l.pending--
		}
		if l.bySource[c.src]--; l.bySource[c.src] == 0 {
			delete(l.bySource, c.src)
		}
		if l.byAddr[c.addr] == c {
			delete(l.byAddr, c.addr)
		}
		l.mu.Unlock()
	})
	return c.Conn.Close()
}
