package fakevllm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// simEngine is one simulated vLLM engine: a PUB socket and a ROUTER replay socket,
// both bound on 127.0.0.1 (vLLM's tcp://*:PORT), a replay buffer of the last
// BufferSteps batches, and a block pool.
//
// Ownership: pool, req, enc and the scratch buffers belong to the engine's driver
// goroutine (one driver owns an engine for a whole run). mu guards seq, ring, conns and
// lastChain: the driver publishes under it, replay connections read the ring under it,
// accept goroutines add connections under it.
type simEngine struct {
	f      *Fleet
	id     int
	worker string
	pubLn  net.Listener // nil for a connecting engine
	repLn  net.Listener
	// dialAddr is the address a connecting engine's PUB dials (serve binds it).
	dialAddr string

	// Driver only.
	pool      *blockPool
	req       *requester
	evicted   []uint64
	msg       []byte
	stored    uint64 // blocks stored, removed in published batches
	removed   uint64
	sinceSamp int

	mu    sync.Mutex
	seq   uint64   // the next batch's sequence: batches published so far
	ring  [][]byte // ring[s % len(ring)] is batch s's payload, for s in [seq-len(ring), seq)
	conns []*pubConn

	dropped  atomic.Uint64 // live messages dropped at a connection's high-water mark
	replays  atomic.Uint64 // replay requests answered
	replayed atomic.Uint64 // batches sent in replay replies
}

// pubConn is one subscriber connected to an engine's PUB socket.
//
// Ownership: the reader goroutine owns z's reads and subs' updates (under mu); the
// writer goroutine owns the writes; mu guards pending, subs and closed, which the
// driver reads and appends to through enqueue.
type pubConn struct {
	e    *simEngine
	z    *zconn
	wake chan struct{} // cap 1: pending has data
	done chan struct{} // closed by close

	mu      sync.Mutex
	pending []byte
	subs    [][]byte // subscribed topic prefixes (ZMTP 3.0 subscription messages)
	closed  bool
	once    sync.Once
}

// maxSubscriptions bounds a connection's subscriptions.
const maxSubscriptions = 64

// listen binds the replay ROUTER and, unless the engine connects (FleetConfig.Connect),
// the PUB; a connecting engine gets the address serve will bind for it (a port the
// kernel gave and this process released).
func (e *simEngine) listen(connect bool) error {
	var err error
	if e.repLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return err
	}
	if connect {
		// A port below the kernel's ephemeral range, held until serve is about to bind
		// it (Fleet.ReleasePorts): a port the kernel handed out once would be handed
		// out again, to the next listener on port 0 (serve's own HTTP or gRPC one).
		l, err := e.f.reservePort()
		if err != nil {
			e.repLn.Close()
			return err
		}
		e.dialAddr = l.Addr().String()
		e.f.placeholders = append(e.f.placeholders, l)
		return nil
	}
	if e.pubLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		e.repLn.Close()
		return err
	}
	return nil
}

func (e *simEngine) endpoint() string {
	if e.dialAddr != "" {
		return "tcp://" + e.dialAddr
	}
	return "tcp://" + e.pubLn.Addr().String()
}

func (e *simEngine) replayEndpoint() string { return "tcp://" + e.repLn.Addr().String() }

// dialLoop is a connecting engine's PUB (vLLM with an endpoint naming a host): it
// dials serve's bound endpoint, runs the connection, and dials again when it ends,
// backing off while serve is not listening, until the fleet closes.
func (e *simEngine) dialLoop() {
	defer e.f.wg.Done()
	backoff := 10 * time.Millisecond
	for !e.f.closing.Load() {
		c, err := net.DialTimeout("tcp", e.dialAddr, 5*time.Second)
		if err != nil {
			select {
			case <-e.f.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		e.f.tracked(e.servePub)(c)
	}
}

// acceptLoop accepts on ln until it is closed, handing each connection to serve in a
// goroutine of its own (a slow handshake never holds the next accept). A failing
// Accept (out of file descriptors) backs off instead of spinning.
func (e *simEngine) acceptLoop(ln net.Listener, serve func(net.Conn)) {
	defer e.f.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.f.acceptErrors.Add(1)
			time.Sleep(backoff)
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		}
		backoff = time.Millisecond
		e.f.wg.Add(1)
		go func() {
			defer e.f.wg.Done()
			serve(c)
		}()
	}
}

// servePub runs one PUB connection: handshake, then the reader here (subscriptions)
// and a writer goroutine (live messages).
func (e *simEngine) servePub(c net.Conn) {
	z, err := handshake(c, "PUB", "SUB", "XSUB")
	if err != nil {
		e.f.handshakeErrors.Add(1)
		c.Close()
		return
	}
	pc := &pubConn{e: e, z: z, wake: make(chan struct{}, 1), done: make(chan struct{})}
	e.mu.Lock()
	if e.f.closing.Load() {
		e.mu.Unlock()
		c.Close()
		return
	}
	e.conns = append(e.conns, pc)
	e.mu.Unlock()
	e.f.wg.Add(1)
	go pc.writer()
	pc.reader()
}

func (pc *pubConn) close() {
	pc.once.Do(func() {
		pc.mu.Lock()
		pc.closed = true
		pc.pending = nil
		pc.mu.Unlock()
		close(pc.done)
		pc.z.c.Close()
		e := pc.e
		e.mu.Lock()
		for i, x := range e.conns {
			if x == pc {
				e.conns = append(e.conns[:i], e.conns[i+1:]...)
				break
			}
		}
		e.mu.Unlock()
	})
}

// reader applies the subscriber's subscriptions until the connection ends.
func (pc *pubConn) reader() {
	defer pc.close()
	var frames [][]byte
	for {
		fr, cmd, err := pc.z.readMessage(frames)
		if err != nil {
			return
		}
		frames = fr
		if len(fr) != 1 {
			continue
		}
		body := fr[0]
		var sub bool
		var topic []byte
		switch {
		case cmd && len(body) >= 10 && string(body[:10]) == "\x09SUBSCRIBE":
			sub, topic = true, body[10:]
		case cmd && len(body) >= 7 && string(body[:7]) == "\x06CANCEL":
			topic = body[7:]
		case !cmd && len(body) >= 1 && (body[0] == 0 || body[0] == 1):
			sub, topic = body[0] == 1, body[1:]
		default:
			continue
		}
		pc.mu.Lock()
		if sub && len(pc.subs) < maxSubscriptions {
			pc.subs = append(pc.subs, bytes.Clone(topic))
		} else if !sub {
			for i, s := range pc.subs {
				if bytes.Equal(s, topic) {
					pc.subs = append(pc.subs[:i], pc.subs[i+1:]...)
					break
				}
			}
		}
		pc.mu.Unlock()
	}
}

// enqueue queues one live message unless the subscriber has not subscribed to topic
// (a PUB drops it) or the queue is past the high-water mark (dropped and counted,
// as a PUB socket at its HWM drops).
func (pc *pubConn) enqueue(msg, topic []byte) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed || !pc.subscribed(topic) {
		return
	}
	if len(pc.pending)+len(msg) > pc.e.f.cfg.HWMBytes {
		pc.e.dropped.Add(1)
		return
	}
	pc.pending = append(pc.pending, msg...)
	select {
	case pc.wake <- struct{}{}:
	default:
	}
}

func (pc *pubConn) subscribed(topic []byte) bool {
	for _, s := range pc.subs {
		if bytes.HasPrefix(topic, s) {
			return true
		}
	}
	return false
}

// writer writes queued messages in bulk until the connection ends; while the fleet is
// stalled it writes nothing (the queue fills to its high-water mark and drops).
func (pc *pubConn) writer() {
	defer pc.e.f.wg.Done()
	var buf []byte
	for {
		select {
		case <-pc.wake:
		case <-pc.done:
			return
		}
		select {
		case <-pc.e.f.gate.wait():
		case <-pc.done:
			return
		}
		pc.mu.Lock()
		buf, pc.pending = pc.pending, buf[:0]
		pc.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := pc.z.c.Write(buf); err != nil {
			pc.close()
			return
		}
	}
}

// serveReplay runs one ROUTER connection: each request [b"", start_seq] from a DEALER
// gets every buffered batch from start_seq on as [b"", topic, seq, payload] (vLLM
// v0.26.0's shape), then the end marker [b"", b"", ff*8, b""]. Other requests are
// ignored, as vLLM ignores them.
func (e *simEngine) serveReplay(c net.Conn) {
	defer c.Close()
	accepted := time.Now()
	z, err := handshake(c, "ROUTER", "DEALER", "REQ")
	if err != nil {
		e.f.handshakeErrors.Add(1)
		return
	}
	var frames [][]byte
	var out []byte
	for {
		fr, cmd, err := z.readMessage(frames)
		if err != nil {
			return
		}
		frames = fr
		if cmd || len(fr) != 2 || len(fr[0]) != 0 || len(fr[1]) != 8 {
			continue
		}
		out = e.replay(out[:0], binary.BigEndian.Uint64(fr[1]))
		if _, err := c.Write(out); err != nil {
			return
		}
		e.f.replayTime.observe(time.Since(accepted))
	}
}

var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replay appends the reply to a request from start.
func (e *simEngine) replay(out []byte, start uint64) []byte {
	var seq [8]byte
	e.mu.Lock()
	first := uint64(0)
	if n := uint64(len(e.ring)); e.seq > n {
		first = e.seq - n
	}
	sent := uint64(0)
	cut := uint64(e.f.replayCut.Load())
	for s := max(start, first); s < e.seq; s++ {
		if cut > 0 && sent == cut {
			e.mu.Unlock()
			e.replays.Add(1)
			e.replayed.Add(sent)
			return out // broken off: the rest, end marker included, dropped
		}
		binary.BigEndian.PutUint64(seq[:], s)
		out = AppendMessage(out, nil, e.f.topic, seq[:], e.ring[s%uint64(len(e.ring))])
		sent++
	}
	e.mu.Unlock()
	e.replays.Add(1)
	e.replayed.Add(sent)
	return AppendMessage(out, nil, nil, endSeq, nil)
}

// publish makes and publishes the engine's next batch (driver only): one request
// against the pool, its evictions and stores as one vLLM batch, at time now.
func (e *simEngine) publish(now time.Time) {
	c := e.req.next()
	first, evicted := e.pool.admit(c, e.evicted[:0])
	e.evicted = evicted
	e.stored += uint64(len(c.hashes) - first)
	e.removed += uint64(len(evicted))
	enc := batchEncoder{enc: e.f.cfg.Encoding, blockSize: e.f.cfg.Workload.BlockSize}
	nev := 1
	if len(evicted) > 0 {
		nev = 2
	}
	bs := e.f.cfg.Workload.BlockSize
	tokens := func(i int, dst []byte) []byte {
		pos := first + i
		m := Enc(dst)
		for j := range bs {
			m = m.Uint(uint64(tokenAt(c.seeds[pos], pos, j)))
		}
		return m
	}
	var seqb [8]byte
	e.mu.Lock()
	seq := e.seq
	slot := &e.ring[seq%uint64(len(e.ring))]
	p := enc.begin((*slot)[:0], float64(now.UnixNano())/1e9, nev)
	if len(evicted) > 0 {
		p = enc.removed(p, evicted)
	}
	p = enc.stored(p, c.hashes[first:], parentOf(c, first), first > 0, tokens)
	p = enc.end(p)
	*slot = p
	e.seq++
	binary.BigEndian.PutUint64(seqb[:], seq)
	e.msg = AppendMessage(e.msg[:0], e.f.topic, seqb[:], p)
	for _, pc := range e.conns {
		pc.enqueue(e.msg, e.f.topic)
	}
	e.mu.Unlock()
	e.f.observe(e, c, now)
}

func parentOf(c *chain, first int) uint64 {
	if first == 0 {
		return 0
	}
	return c.hashes[first-1]
}

// counts returns what the engine published (call with its driver stopped).
func (e *simEngine) counts() (batches, stored, removed uint64, held int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq, e.stored, e.removed, e.pool.len()
}

// closeConns closes every live connection (Fleet.Close).
func (e *simEngine) closeConns() {
	e.mu.Lock()
	conns := append([]*pubConn(nil), e.conns...)
	e.mu.Unlock()
	for _, pc := range conns {
		pc.close()
	}
}
