package subscriber

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The ZMTP guard.
//
// zmq4's connection reader allocates every frame at the length its header declares,
// before reading the body, and its handshake parses the peer's READY metadata without
// bounds checks: one 9-byte frame header declaring 2^50 bytes panics (makeslice) in a
// goroutine nobody recovers, 2^40 is a fatal out-of-memory, and a truncated READY
// property slices out of range. None of it can be fixed from the socket's API, so every
// socket this package opens goes through a transport of its own, registered with zmq4
// under internal scheme names: its net.Conn parses the ZMTP 3.x stream as zmq4 reads it
// (the greeting, then each frame header, buffering and checking command frames whole)
// and fails the read, closing the connection, before zmq4 sees a header or a command it
// would mishandle. Message bodies pass through unbuffered, so a good stream costs one
// header parse per frame, read through a buffer (readBufferBytes).
//
// What the guard refuses (ErrPeerRefused, reported once per connection through
// guard.refused):
//   - a greeting that is not ZMTP 3.x with the NULL mechanism;
//   - a command frame over maxCommandBytes, a command with the MORE flag or inside a
//     multi-part message, a first command that is not a well-formed READY naming a
//     socket type compatible with ours;
//   - a message frame before the handshake, reserved flag bits, a message of more than
//     maxMessageFrames frames, or whose frames add up past the per-message cap;
//   - on a bound socket, a peer whose address is not in Config.AllowedPeers (when set),
//     and a connection past guard.maxConns open at once (the endpoint serves one
//     publisher; each connection may hold one capped frame in zmq4) unless the open
//     connection idle longest has been idle evictIdle or more: that one is closed to make
//     room, so idle connections cannot lock the real publisher out (it reconnects, and
//     it is the one that sends). On a SUB socket only a message shaped as a publisher's
//     counts as activity: [topic, an 8-byte sequence, a payload that opens a msgpack
//     array, as every vLLM and SGLang batch does]; a peer that sends anything else
//     (garbage every half second, say) is as idle as a silent one, and is evicted.
//
// A peer that does not finish the handshake within guard.handshake is cut off too (zmq4
// would wait forever, holding its accept loop or the dialling goroutine).

// ErrPeerRefused wraps every refusal of a peer by the ZMTP guard: an oversized frame, a
// malformed greeting or handshake, too many connections.
var ErrPeerRefused = errors.New("subscriber: peer refused")

// Guard bounds.
const (
	// maxCommandBytes bounds a command frame's body (READY carries a socket type and an
	// identity of at most 255 bytes; libzmq's other commands are smaller still).
	maxCommandBytes = 64 << 10
	// maxMessageFrames bounds the frames of one message: a live message has 3, a replay
	// reply at most 4 (delimiter, topic, seq, payload). zmq4 keeps a slice entry per
	// frame, so empty frames must be bounded too.
	maxMessageFrames = 16
	// maxBoundConns bounds the connections a bound SUB socket holds at once.
	maxBoundConns = MaxBoundConns
	// evictIdle is how long a bound socket's connection must have passed no byte
	// before a new one may take its place when the socket is full.
	evictIdle = 2 * time.Second

	// readBufferBytes is each guarded connection's read buffer. zmq4 reads a message
	// as a 2-byte header, then the body, then the next header, each straight from the
	// connection: without a buffer a live message took five or six read system calls
	// (three frames), and with a backlog of small batches one read now fetches many.
	// A body larger than the buffer is read into zmq4's frame directly. 2,048
	// connections hold 16 MiB.
	readBufferBytes = 8 << 10

	zmtpGreetingLen = 64
	flagMore        = 0x1
	flagLong        = 0x2
	flagCommand     = 0x4
)

// Internal transport names (never seen by users: CheckEndpoint accepts tcp:// and ipc://
// only, and guardedEndpoint maps them).
const (
	guardTCP = "kvindex-guard-tcp"
	guardIPC = "kvindex-guard-ipc"
)

// guard is the per-socket configuration of the guarded transport.
type guard struct {
	self      zmq4.SocketType // our socket's type: the peer's READY must be compatible
	maxMsg    uint64          // per-message cap: the sum of a message's frame bodies
	handshake time.Duration   // bound on greeting + READY
	maxConns  int64           // bound socket: connections open at once
	refused   func(err error) // called once per refused connection, from any goroutine
	allowed   []*net.IPNet    // bound socket: the peers accepted (nil: any)
	// sink, when set (the SUB socket's guard), receives every message after the
	// handshake, whole, in the connection's reader goroutine, instead of zmq4: frames
	// are views of the connection's buffer, valid until sink returns. gen is the
	// generation of the socket the connection belongs to (guard.gen when it opened),
	// so that a sink can drop what a closing socket's connection still reads.
	sink func(gen uint64, frames [][]byte)
	gen  atomic.Uint64

	live atomic.Int64 // guarded connections not yet closed
	// conns are the bound socket's open connections, for eviction (Accept and Close).
	mu    sync.Mutex
	conns map[*guardConn]struct{}
}

// admits reports whether the peer at addr may connect to a bound socket.
func (g *guard) admits(addr net.Addr) bool {
	if g.allowed == nil {
		return true
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return true // a Unix socket's peers are the host's processes
	}
	for _, n := range g.allowed {
		if n.Contains(tcp.IP) {
			return true
		}
	}
	return false
}

// evictIdlest closes the open connection idle longest if it has been idle evictIdle,
// and reports whether it did.
func (g *guard) evictIdlest(now int64) bool {
	g.mu.Lock()
	var oldest *guardConn
	for c := range g.conns {
		if oldest == nil || c.active.Load() < oldest.active.Load() {
			oldest = c
		}
	}
	g.mu.Unlock()
	if oldest == nil || now-oldest.active.Load() < int64(evictIdle) {
		return false
	}
	g.refused(fmt.Errorf("%w: %s: idle for %v while the bound socket was full; closed for a new connection",
		ErrPeerRefused, oldest.RemoteAddr(), time.Duration(now-oldest.active.Load()).Round(time.Millisecond)))
	_ = oldest.Close()
	return true
}

// ParsePeers parses a bound socket's allowed peers: IP addresses and CIDR prefixes.
func ParsePeers(peers []string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, p := range peers {
		if !strings.Contains(p, "/") {
			ip := net.ParseIP(p)
			if ip == nil {
				return nil, fmt.Errorf("allowed peer %q is not an IP address or a CIDR prefix", p)
			}
			bits := 8 * len(ip.To16())
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(p)
		if err != nil {
			return nil, fmt.Errorf("allowed peer %q: %v", p, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// guards maps the ids embedded in guarded endpoints to their guards while zmq4 dials
// or listens (Dial and Listen are synchronous; accepted connections reach the guard
// through the listener).
var guards = struct {
	sync.Mutex
	next uint64
	m    map[uint64]*guard
}{m: map[uint64]*guard{}}

func init() {
	for name, network := range map[string]string{guardTCP: "tcp", guardIPC: "unix"} {
		if err := zmq4.RegisterTransport(name, guardTransport{network: network, net: transport.New(network)}); err != nil {
			panic(err) // only a duplicate name fails, and these are ours
		}
	}
}

// guardedEndpoint maps a tcp:// or ipc:// endpoint to the guarded transport with g. The
// caller must call release once zmq4's Dial or Listen has returned.
func guardedEndpoint(endpoint string, g *guard) (ep string, release func(), err error) {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", nil, fmt.Errorf("subscriber: %q is not SCHEME://ADDRESS", endpoint)
	}
	switch scheme {
	case "tcp":
		scheme = guardTCP
	case "ipc":
		scheme = guardIPC
	default:
		return "", nil, fmt.Errorf("subscriber: %q: unsupported transport %q", endpoint, scheme)
	}
	guards.Lock()
	guards.next++
	id := guards.next
	guards.m[id] = g
	guards.Unlock()
	release = func() {
		guards.Lock()
		delete(guards.m, id)
		guards.Unlock()
	}
	return scheme + "://" + strconv.FormatUint(id, 10) + "@" + rest, release, nil
}

// guardTransport is the zmq4 transport of the guarded schemes. Its addresses are
// "ID@ADDRESS", ID naming the guard in guards.
type guardTransport struct {
	network string
	net     transport.Transport
}

func splitGuarded(addr string) (*guard, string, error) {
	idStr, rest, ok := strings.Cut(addr, "@")
	id, err := strconv.ParseUint(idStr, 10, 64)
	if !ok || err != nil {
		return nil, "", fmt.Errorf("subscriber: %q is not a guarded address", addr)
	}
	guards.Lock()
	g := guards.m[id]
	guards.Unlock()
	if g == nil {
		return nil, "", fmt.Errorf("subscriber: guard %d is gone", id)
	}
	return g, rest, nil
}

func (t guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	g, rest, err := splitGuarded(addr)
	if err != nil {
		return nil, err
	}
	c, err := t.net.Dial(ctx, d, rest)
	if err != nil {
		return nil, err
	}
	g.live.Add(1)
	return newGuardConn(c, g), nil
}

func (t guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	g, rest, err := splitGuarded(addr)
	if err != nil {
		return nil, err
	}
	l, err := t.net.Listen(ctx, rest)
	if err != nil {
		return nil, err
	}
	return &guardListener{Listener: l, g: g}, nil
}

// Addr normalises the address part as zmq4's own transport does ("*" hosts and ports),
// keeping the guard id in front.
func (t guardTransport) Addr(ep string) (string, error) {
	id, rest, ok := strings.Cut(ep, "@")
	if !ok {
		return "", fmt.Errorf("subscriber: %q is not a guarded address", ep)
	}
	a, err := t.net.Addr(rest)
	if err != nil {
		return "", err
	}
	return id + "@" + a, nil
}

// guardListener wraps the accepted connections and bounds how many are open at once.
type guardListener struct {
	net.Listener
	g *guard
}

// Accept backs off on a failing accept (out of file descriptors: EMFILE, ENFILE) and
// tries again, as net/http's Serve does, instead of returning the error: zmq4's accept
// loop retries a failed Accept at once, forever, so one bound socket would spin a core
// until descriptors came back, and a serve with 2,048 bound engines has as many loops.
// A closed listener's error is returned.
func (l *guardListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || !acceptRetryable(err) {
				return nil, err
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !l.g.admits(c.RemoteAddr()) {
			_ = c.Close()
			l.g.refused(fmt.Errorf("%w: %s: not an allowed peer of this bound socket", ErrPeerRefused, c.RemoteAddr()))
			continue
		}
		if l.g.live.Load() >= l.g.maxConns {
			l.g.evictIdlest(time.Now().UnixNano())
		}
		if l.g.live.Add(1) > l.g.maxConns {
			l.g.live.Add(-1)
			_ = c.Close()
			l.g.refused(fmt.Errorf("%w: %s: %d connections already open on this bound socket",
				ErrPeerRefused, c.RemoteAddr(), l.g.maxConns))
			continue
		}
		gc := newGuardConn(c, l.g)
		l.g.mu.Lock()
		if l.g.conns == nil {
			l.g.conns = map[*guardConn]struct{}{}
		}
		l.g.conns[gc] = struct{}{}
		l.g.mu.Unlock()
		return gc, nil
	}
}

// acceptRetryable reports whether a failed Accept may succeed later: the process or
// the system is out of file descriptors, or a connection was aborted before it was
// accepted.
func acceptRetryable(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// guardConn is one guarded connection. Read is called by one zmq4 goroutine at a time
// (the handshake, then the connection's reader), so the parser state needs no lock.
type guardConn struct {
	net.Conn
	g  *guard
	br *bufio.Reader // every read of Conn goes through it

	greeted  bool   // the peer's greeting was checked and delivered
	ready    bool   // the peer's READY was checked: the handshake is over
	pending  []byte // checked bytes not yet handed to zmq4 (a header, a command frame)
	buf      []byte // backing store of pending
	bodyLeft uint64 // bytes of the current message frame's body still to pass through
	msgBytes uint64 // body bytes of the current multi-part message so far
	frames   int    // frames of the current multi-part message so far
	msgFrame bool   // the unit advance read last is a message frame's header
	more     bool   // ... with the MORE flag
	err      error  // sticky: once failed, every Read fails

	// With a sink (guard.sink): the message being read, its frames' ends in msg, and
	// the views handed to the sink. msg is kept between messages up to keepMsgBytes.
	gen  uint64
	msg  []byte
	ends [maxMessageFrames]int
	nf   int
	fr   [maxMessageFrames][]byte

	closeOnce sync.Once
	closeErr  error
	// active is when the connection last passed bytes, or with a sink a message
	// shaped as a publisher's (publisherShaped), or was opened (Unix nanoseconds; any
	// goroutine reads it for eviction).
	active atomic.Int64
}

func newGuardConn(c net.Conn, g *guard) *guardConn {
	gc := &guardConn{Conn: c, g: g, br: bufio.NewReaderSize(c, readBufferBytes), buf: make([]byte, zmtpGreetingLen), gen: g.gen.Load()}
	gc.active.Store(time.Now().UnixNano())
	if g.handshake > 0 {
		_ = c.SetDeadline(time.Now().Add(g.handshake))
	}
	return gc
}

// Close closes the connection once; every guarded connection is closed through it
// (zmq4 does not close a connection whose handshake failed, so the guard does).
func (c *guardConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		c.g.live.Add(-1)
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return c.closeErr
}

func (c *guardConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && !c.ready {
		_ = c.Close()
	}
	return n, err
}

func (c *guardConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.pending) == 0 && c.bodyLeft == 0 && c.err == nil {
		var err error
		if c.g.sink != nil && c.ready {
			err = c.deliver()
		} else {
			err = c.advance()
		}
		if err != nil {
			c.fail(err)
		}
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	if uint64(len(p)) > c.bodyLeft {
		p = p[:c.bodyLeft]
	}
	n, err := c.br.Read(p)
	c.bodyLeft -= uint64(n)
	if n > 0 {
		c.active.Store(time.Now().UnixNano())
	}
	if err != nil {
		c.fail(err)
	}
	return n, err
}

// keepMsgBytes is the message buffer a sink's connection keeps between messages: a
// larger one (a rare huge batch) is let go, so that 2,048 connections do not each keep
// the largest message they ever read.
const keepMsgBytes = 64 << 10

// deliver reads message frames and hands each whole message to the guard's sink, in
// this goroutine (zmq4's reader of the connection, which stays in this Read), until a
// command frame (left in pending for zmq4) or an error (returned to zmq4, which ends
// the connection). A message costs one copy, from the read buffer into msg, no
// allocation once msg has grown to the stream's message size, and no goroutine hop.
func (c *guardConn) deliver() error {
	for {
		if err := c.advance(); err != nil {
			return err
		}
		if !c.msgFrame {
			return nil
		}
		// advance checked the frame against the per-message cap.
		c.pending = nil
		start, size := len(c.msg), int(c.bodyLeft)
		if cap(c.msg)-start < size {
			nb := make([]byte, start, max(2*cap(c.msg), start+size))
			copy(nb, c.msg)
			c.msg = nb
		}
		c.msg = c.msg[:start+size]
		if _, err := io.ReadFull(c.br, c.msg[start:]); err != nil {
			return err
		}
		c.bodyLeft = 0
		c.ends[c.nf] = len(c.msg)
		c.nf++
		if c.more {
			continue
		}
		frames, prev := c.fr[:c.nf], 0
		for i := range frames {
			frames[i], prev = c.msg[prev:c.ends[i]], c.ends[i]
		}
		if publisherShaped(frames) {
			c.active.Store(time.Now().UnixNano())
		}
		c.g.sink(c.gen, frames)
		clear(frames)
		c.msg, c.nf = c.msg[:0], 0
		if cap(c.msg) > keepMsgBytes {
			c.msg = nil
		}
	}
}

// publisherShaped reports whether a live message has a publisher's shape: [topic,
// 8-byte sequence, payload opening a msgpack array]. A message of another shape is
// delivered all the same (the subscriber counts what it cannot decode); it only does
// not count as the connection's activity, so garbage cannot hold a bound socket's slot.
func publisherShaped(frames [][]byte) bool {
	if len(frames) != 3 || len(frames[1]) != 8 || len(frames[2]) == 0 {
		return false
	}
	b := frames[2][0]
	return b&0xf0 == 0x90 || b == 0xdc || b == 0xdd // fixarray, array 16, array 32
}

// fail records the connection's first error. Before the handshake is over it closes
// the connection: zmq4 leaves a connection whose handshake failed open.
func (c *guardConn) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.pending = nil
	if !c.ready || errors.Is(err, ErrPeerRefused) {
		_ = c.Close()
	}
}

// refuse reports a refusal (once per connection: the connection fails for good).
func (c *guardConn) refuse(format string, args ...any) error {
	err := fmt.Errorf("%w: %s: %s", ErrPeerRefused, c.RemoteAddr(), fmt.Sprintf(format, args...))
	c.g.refused(err)
	return err
}

// advance reads and checks the next unit of the stream: the greeting, or a frame
// header (with the whole body for a command frame). It leaves it in pending, and for a
// message frame the body length in bodyLeft.
func (c *guardConn) advance() error {
	if !c.greeted {
		return c.readGreeting()
	}
	hdr := c.buf[:2]
	if _, err := io.ReadFull(c.br, hdr); err != nil {
		return err
	}
	flags, n, size := hdr[0], 2, uint64(hdr[1])
	c.msgFrame = false
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return c.refuse("reserved frame flag bits set (%#02x)", flags)
	}
	if flags&flagLong != 0 {
		n = 9
		if _, err := io.ReadFull(c.br, c.buf[2:n]); err != nil {
			return err
		}
		size = binary.BigEndian.Uint64(c.buf[1:n])
	}
	if flags&flagCommand != 0 {
		return c.readCommand(flags, n, size)
	}
	if !c.ready {
		return c.refuse("message frame before the handshake")
	}
	c.frames++
	switch {
	case c.frames > maxMessageFrames:
		return c.refuse("message of more than %d frames", maxMessageFrames)
	case size > c.g.maxMsg-c.msgBytes:
		return c.refuse("frame of %d bytes takes the message past the %d-byte cap", size, c.g.maxMsg)
	}
	c.msgBytes += size
	c.msgFrame, c.more = true, flags&flagMore != 0
	if flags&flagMore == 0 {
		c.frames, c.msgBytes = 0, 0
	}
	c.bodyLeft = size
	c.pending = c.buf[:n]
	return nil
}

// readGreeting checks the 64-byte ZMTP 3.x greeting: signature, version 3 or later,
// the NULL mechanism (the only one these sockets speak).
func (c *guardConn) readGreeting() error {
	g := c.buf[:zmtpGreetingLen]
	if _, err := io.ReadFull(c.br, g); err != nil {
		return err
	}
	switch {
	case g[0] != 0xff || g[9] != 0x7f:
		return c.refuse("not a ZMTP greeting")
	case g[10] < 3:
		return c.refuse("ZMTP version %d.%d (want 3.x)", g[10], g[11])
	case string(trimNUL(g[12:32])) != "NULL":
		return c.refuse("security mechanism %q (want NULL)", trimNUL(g[12:32]))
	}
	c.greeted = true
	c.pending = g
	return nil
}

func trimNUL(b []byte) []byte {
	for i, x := range b {
		if x == 0 {
			return b[:i]
		}
	}
	return b
}

// readCommand reads a command frame whole (bounded), checks the first one is the
// peer's READY, and leaves header and body in pending.
func (c *guardConn) readCommand(flags byte, n int, size uint64) error {
	switch {
	case flags&flagMore != 0:
		return c.refuse("command frame with the MORE flag")
	case c.frames > 0:
		return c.refuse("command frame inside a multi-part message")
	case size > maxCommandBytes:
		return c.refuse("command frame of %d bytes (at most %d)", size, maxCommandBytes)
	}
	total := n + int(size)
	if cap(c.buf) < total {
		nb := make([]byte, total)
		copy(nb, c.buf[:n])
		c.buf = nb
	}
	frame := c.buf[:total]
	if _, err := io.ReadFull(c.br, frame[n:]); err != nil {
		return err
	}
	if !c.ready {
		if err := c.checkReady(frame[n:]); err != nil {
			return err
		}
		c.ready = true
		_ = c.Conn.SetDeadline(time.Time{})
	}
	c.pending = frame
	return nil
}

// checkReady parses a READY command as zmq4 will, with every length checked: name
// length, name, then properties (key length, key, 4-byte value length, value). The
// Socket-Type property must name a type compatible with ours.
func (c *guardConn) checkReady(body []byte) error {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return c.refuse("malformed command")
	}
	if name := string(body[1 : 1+body[0]]); name != "READY" {
		return c.refuse("first command is %q, not READY", name)
	}
	var peer string
	types := 0
	for p := body[1+body[0]:]; len(p) > 0; {
		klen := int(p[0])
		if len(p) < 1+klen+4 {
			return c.refuse("truncated READY property")
		}
		key := string(p[1 : 1+klen])
		vlen := binary.BigEndian.Uint32(p[1+klen:])
		p = p[1+klen+4:]
		if uint64(vlen) > uint64(len(p)) {
			return c.refuse("READY property %q overruns the command", key)
		}
		if strings.EqualFold(key, "Socket-Type") {
			// zmq4 title-cases keys before looking the type up, and panics on a type it
			// does not know: only the exact spelling (libzmq's and zmq4's) is sure to
			// reach it as the value checked here.
			if key != "Socket-Type" {
				return c.refuse("READY property spelled %q", key)
			}
			peer = string(p[:vlen])
			types++
		}
		p = p[vlen:]
	}
	if types != 1 {
		return c.refuse("READY carries %d Socket-Type properties", types)
	}
	if !c.g.self.IsCompatible(zmq4.SocketType(peer)) {
		return c.refuse("peer socket type %q cannot talk to %s", peer, c.g.self)
	}
	return nil
}
