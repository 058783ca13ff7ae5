package fakevllm

// Hostile peers and a minimal publisher for tests of the subscriber and the daemons: a
// real greeting and READY, then whatever frame headers a test wants, checked by
// nothing.

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"
)

// Greeting is a ZMTP 3.0 greeting with the NULL mechanism.
func Greeting() []byte {
	g := make([]byte, zmtpGreetingLen)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// Ready is a READY command frame naming socket type typ.
func Ready(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{flagCommand, byte(len(body))}, body...)
}

// LongHeader is a long frame header (flags | LONG) declaring size bytes.
func LongHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

// Message encodes frames as one ZMTP message.
func Message(frames ...[]byte) []byte { return AppendMessage(nil, frames...) }

// Hostile writes the greeting and payload on c, then reads until the other side closes
// the connection (at most 30 s).
func Hostile(c net.Conn, payload []byte) {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(append(Greeting(), payload...)); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// ServeHostile accepts connections on l until it is closed and plays Hostile on each;
// every connection the other side closed is reported on closed (which must have room
// or a reader). It returns once l is closed and every connection's goroutine is done,
// so a test that waits for it leaves none behind.
func ServeHostile(l net.Listener, payload []byte, closed chan<- struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			Hostile(c, payload)
			closed <- struct{}{}
		}()
	}
}

// Pub is a well-behaved publisher: it greets as a PUB, discards what the SUB sends (its
// READY and subscription), and writes [topic, seq, payload] messages to every
// connection. Batch's batches clear the worker and store one block of 4 tokens, so a
// subscriber that applies any of them is live.
type Pub struct {
	mu    sync.Mutex
	conns []net.Conn
	l     net.Listener
	wg    sync.WaitGroup
	seq   uint64
}

func (p *Pub) add(c net.Conn) {
	if _, err := c.Write(append(Greeting(), Ready("PUB")...)); err != nil {
		c.Close()
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(io.Discard, c)
	}()
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// ListenPub listens on addr (HOST:PORT) for subscribers that dial.
func ListenPub(addr string) (*Pub, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Pub{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.add(c)
		}
	}()
	return p, nil
}

// DialPub connects to a bound subscriber at addr (HOST:PORT).
func DialPub(addr string) (*Pub, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Pub{}
	p.add(c)
	return p, nil
}

// Batch is the payload of the batch with sequence seq: AllBlocksCleared, then one
// stored block (hash seq+1, tokens 1 2 3 4, block size 4), data-parallel rank 0.
func Batch(seq uint64) []byte {
	return Enc{}.Arr(3).F64(1750000000).Arr(2).
		Arr(1).Str("AllBlocksCleared").
		Arr(8).Str("BlockStored").Arr(1).Uint(seq + 1).Nil().Arr(4).Uint(1).Uint(2).Uint(3).Uint(4).
		Uint(4).Nil().Str("GPU").Nil().
		Uint(0)
}

// Send writes the next batch to every connection (one the subscriber dropped just
// misses it).
func (p *Pub) Send() { p.send(nil) }

// SendPayload writes payload (an encoded batch, Enc) as the next message, as Send does.
func (p *Pub) SendPayload(payload []byte) { p.send(payload) }

func (p *Pub) send(payload []byte) {
	var seq [8]byte
	p.mu.Lock()
	defer p.mu.Unlock()
	binary.BigEndian.PutUint64(seq[:], p.seq)
	if payload == nil {
		payload = Batch(p.seq)
	}
	msg := Message([]byte{}, seq[:], payload)
	p.seq++
	for _, c := range p.conns {
		_, _ = c.Write(msg)
	}
}

// Close closes the listener and every connection and waits for the goroutines.
func (p *Pub) Close() {
	if p.l != nil {
		p.l.Close()
	}
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Conns returns how many connections the Pub writes to.
func (p *Pub) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Addr is the listening address of a Pub from ListenPub ("" for DialPub's).
func (p *Pub) Addr() string {
	if p.l == nil {
		return ""
	}
	return p.l.Addr().String()
}
