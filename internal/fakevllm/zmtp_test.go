package fakevllm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"
)

// TestHandshakeAndBounds: the engine side greets and reads a peer's READY, refuses a
// peer of the wrong socket type, and refuses an inbound frame past its bound before
// allocating it (a frame header declaring 2^40 bytes).
func TestHandshakeAndBounds(t *testing.T) {
	pair := func(t *testing.T, peerType string, after []byte) error {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		go func() {
			buf := make([]byte, zmtpGreetingLen+len(Ready("PUB")))
			_, _ = b.Read(buf)
			_, _ = b.Write(append(append(Greeting(), Ready(peerType)...), after...))
		}()
		z, err := handshake(a, "PUB", "SUB")
		if err != nil {
			return err
		}
		_, _, err = z.readMessage(nil)
		return err
	}
	sub := AppendMessage(nil, []byte{1})
	if err := pair(t, "SUB", sub); err != nil {
		t.Fatalf("subscription: %v", err)
	}
	if err := pair(t, "DEALER", nil); !errors.Is(err, errProtocol) {
		t.Fatalf("DEALER peer on a PUB: %v", err)
	}
	huge := binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<40)
	if err := pair(t, "SUB", huge); !errors.Is(err, errProtocol) {
		t.Fatalf("2^40-byte frame: %v", err)
	}
	many := bytes.Repeat([]byte{flagMore, 0}, maxInboundFrames+1)
	if err := pair(t, "SUB", many); !errors.Is(err, errProtocol) {
		t.Fatalf("%d-frame message: %v", maxInboundFrames+1, err)
	}
}
