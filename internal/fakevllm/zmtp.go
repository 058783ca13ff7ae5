package fakevllm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The ZMTP 3.0 subset a simulated engine speaks: the NULL-mechanism greeting, READY
// with a Socket-Type, and message frames. A PUB side (live batches) and a ROUTER side
// (replay) talk to the subscriber's zmq4 SUB and DEALER sockets, which check every
// byte through subscriber's ZMTP guard, so a framing mistake here fails the run.

// ZMTP framing constants.
const (
	zmtpGreetingLen = 64
	flagMore        = 0x01
	flagLong        = 0x02
	flagCommand     = 0x04
	// maxInboundFrame bounds a frame a subscriber sends us: subscriptions and replay
	// requests are a few bytes; READY carries a socket type and an identity.
	maxInboundFrame = 4 << 10
	// maxInboundFrames bounds the frames of one inbound message.
	maxInboundFrames = 8
	// handshakeTimeout bounds the greeting and READY exchange.
	handshakeTimeout = 10 * time.Second
)

var errProtocol = errors.New("fakevllm: ZMTP protocol error")

// AppendFrame appends one message frame (MORE set when more follow).
func AppendFrame(dst []byte, more bool, body []byte) []byte {
	flags := byte(0)
	if more {
		flags = flagMore
	}
	if len(body) > 255 {
		dst = append(dst, flags|flagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

// AppendMessage appends frames as one ZMTP message.
func AppendMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		dst = AppendFrame(dst, i < len(frames)-1, f)
	}
	return dst
}

// zconn is one accepted ZMTP connection: buffered reads of the peer's frames.
type zconn struct {
	c  net.Conn
	br *bufio.Reader
}

// handshake greets the peer as socket type self, reads its greeting and READY, and
// checks that its socket type is one of peers.
func handshake(c net.Conn, self string, peers ...string) (*zconn, error) {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if _, err := c.Write(append(Greeting(), Ready(self)...)); err != nil {
		return nil, err
	}
	z := &zconn{c: c, br: bufio.NewReaderSize(c, 512)}
	var g [zmtpGreetingLen]byte
	if _, err := io.ReadFull(z.br, g[:]); err != nil {
		return nil, err
	}
	if g[0] != 0xff || g[9] != 0x7f || g[10] < 3 || string(g[12:16]) != "NULL" {
		return nil, fmt.Errorf("%w: bad greeting", errProtocol)
	}
	frames, cmd, err := z.readMessage(nil)
	if err != nil {
		return nil, err
	}
	if !cmd || len(frames) != 1 {
		return nil, fmt.Errorf("%w: first frame is not a command", errProtocol)
	}
	peer, err := readySocketType(frames[0])
	if err != nil {
		return nil, err
	}
	ok := false
	for _, p := range peers {
		ok = ok || p == peer
	}
	if !ok {
		return nil, fmt.Errorf("%w: peer socket type %q cannot talk to %s", errProtocol, peer, self)
	}
	_ = c.SetDeadline(time.Time{})
	return z, nil
}

// readySocketType parses a READY command body and returns its Socket-Type.
func readySocketType(body []byte) (string, error) {
	if len(body) < 1 || int(body[0]) > len(body)-1 || string(body[1:1+body[0]]) != "READY" {
		return "", fmt.Errorf("%w: first command is not READY", errProtocol)
	}
	for p := body[1+body[0]:]; len(p) > 0; {
		klen := int(p[0])
		if len(p) < 1+klen+4 {
			return "", fmt.Errorf("%w: truncated READY property", errProtocol)
		}
		key := string(p[1 : 1+klen])
		vlen := binary.BigEndian.Uint32(p[1+klen:])
		p = p[1+klen+4:]
		if uint64(vlen) > uint64(len(p)) {
			return "", fmt.Errorf("%w: READY property overruns the command", errProtocol)
		}
		if key == "Socket-Type" {
			return string(p[:vlen]), nil
		}
		p = p[vlen:]
	}
	return "", fmt.Errorf("%w: READY without Socket-Type", errProtocol)
}

// readMessage reads one message (all its frames) into dst's storage; cmd reports a
// command frame. Frames and their count are bounded (maxInboundFrame,
// maxInboundFrames): the peer is our own subscriber, but a bug there must not make us
// allocate without bound.
func (z *zconn) readMessage(dst [][]byte) (frames [][]byte, cmd bool, err error) {
	frames = dst[:0]
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(z.br, hdr[:2]); err != nil {
			return nil, false, err
		}
		flags, size := hdr[0], uint64(hdr[1])
		if flags&flagLong != 0 {
			if _, err := io.ReadFull(z.br, hdr[2:9]); err != nil {
				return nil, false, err
			}
			size = binary.BigEndian.Uint64(hdr[1:9])
		}
		if size > maxInboundFrame || len(frames) >= maxInboundFrames {
			return nil, false, fmt.Errorf("%w: inbound frame of %d bytes or message of %d frames", errProtocol, size, len(frames)+1)
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(z.br, body); err != nil {
			return nil, false, err
		}
		frames = append(frames, body)
		cmd = cmd || flags&flagCommand != 0
		if flags&flagMore == 0 || flags&flagCommand != 0 {
			return frames, cmd, nil
		}
	}
}
