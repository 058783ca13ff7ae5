package subscriber

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/kvevents"
)

// realBatch is a decodable batch of about size bytes: one stored event of 16-token
// blocks with random-looking hashes and token ids.
func realBatch(size int) []byte {
	blocks := max(1, size/70)
	m := fakevllm.Enc{}.Arr(3).F64(1750000000).Arr(1).Arr(8).Str("BlockStored").Arr(blocks)
	for i := range blocks {
		m = m.Uint(uint64(i)*0x9e3779b97f4a7c15 | 1<<63)
	}
	m = m.Nil().Arr(blocks * 16)
	for i := range blocks * 16 {
		m = m.Uint(uint64(i*7919) % 150000)
	}
	return m.Uint(16).Nil().Str("GPU").Nil().Uint(0)
}

// floodPub accepts one subscriber and writes n copies of msg after the handshake.
func floodPub(b *testing.B, msg []byte, n int) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	b.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		wrote := make(chan struct{})
		defer func() { c.Close(); <-wrote }() // the writer fails on the closed conn and ends
		go func() {
			defer close(wrote)
			if _, err := c.Write(append(fakevllm.Greeting(), fakevllm.Ready("PUB")...)); err != nil {
				return
			}
			for range n {
				if _, err := c.Write(msg); err != nil {
					return
				}
			}
		}()
		_, _ = io.Copy(io.Discard, c) // until the subscriber closes
	}()
	return "tcp://" + l.Addr().String()
}

// BenchmarkRecv compares receiving messages through zmq4 alone and through the ZMTP
// guard over loopback TCP, next to decoding a batch of the same size (the path every
// live message takes after it). The libzmq alternative (ZMQ_MAXMSGSIZE through cgo) is
// measured outside the module, see DESIGN.md.
func BenchmarkRecv(b *testing.B) {
	for _, size := range []int{1 << 10, 4 << 10, 64 << 10, 1 << 20} {
		payload := realBatch(size)
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], 1)
		msg := fakevllm.Message([]byte{}, seq[:], payload)
		name := "size=" + strconv.Itoa(size>>10) + "KiB"
		for _, path := range []string{"zmq4", "guard"} {
			b.Run(name+"/"+path, func(b *testing.B) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				ep := floodPub(b, msg, b.N)
				var sock zmq4.Socket
				var err error
				if path == "guard" {
					g := &guard{self: zmq4.Sub, maxMsg: DefaultMaxMessageBytes, handshake: 5 * time.Second, maxConns: 1, refused: func(error) {}}
					sock, err = openSub(ctx, ep, "", false, 5*time.Second, g)
				} else {
					sock = zmq4.NewSub(ctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(0), zmq4.WithAutomaticReconnect(false))
					if err = sock.SetOption(zmq4.OptionSubscribe, ""); err == nil {
						err = sock.Dial(ep)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				defer closeDrain(sock)
				b.SetBytes(int64(len(payload)))
				b.ResetTimer()
				for range b.N {
					m, err := sock.Recv()
					if err != nil {
						b.Fatal(err)
					}
					if len(m.Frames) != 3 || len(m.Frames[2]) != len(payload) {
						b.Fatalf("got %d frames", len(m.Frames))
					}
				}
			})
		}
		b.Run(name+"/decode", func(b *testing.B) {
			d, err := kvevents.New(kvevents.Config{BlockSize: 16})
			if err != nil {
				b.Fatal(err)
			}
			var batch kvevents.Batch
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
