package fleet

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/fakevllm"
)

// BenchmarkWakeFloor measures what serve's CPU per applied batch cannot go below on this
// machine with its way of reading, whatever the index and the decoder cost: the
// process's CPU to read lone messages from many loopback connections and do nothing with
// them. A child process (this test binary again, wakeFloorWriter) dials conns
// connections and writes rate messages a second over all of them in turn, each message
// three frames as a vLLM publisher sends (topic, 8-byte sequence, a payload of 1,000
// bytes), for 5 seconds, and this process reads them:
//
//   - reader=netpoll: serve's way: a goroutine per connection reads what has arrived
//     into an 8 KiB buffer (as the ZMTP guard's buffered reader fills), parking in Go's
//     netpoller when the connection is drained: each lone message costs a wake-up of its
//     goroutine and two reads (the message, then EAGAIN).
//   - reader=epoll (Linux): one goroutine on a locked thread waits in epoll_wait on every
//     connection (sockets Go's netpoller does not know) and reads each ready one once:
//     one read per message and one wait per wake-up, shared by the connections ready
//     together.
//
// cpu-µs/msg is this process's CPU time (user and system) over the messages read: the
// reads, the waits and the scheduler's wake-ups, nothing else. kvindex loadtest
// --engines 64 at 8,000 batches/s is the first case (its batches: 13 stored blocks of
// 16 tokens and 13 removed, about 1 KB).
//
// One measurement per benchmark run, whatever b.N: use -benchtime 1x.
func BenchmarkWakeFloor(b *testing.B) {
	const d, size = 5 * time.Second, 1000
	for _, c := range []struct{ conns, rate int }{{64, 8000}, {8, 8000}, {64, 2000}} {
		b.Run(fmt.Sprintf("reader=netpoll/conns=%d/rate=%d", c.conns, c.rate), func(b *testing.B) {
			reportFloor(b, netpollFloor(b, c.conns, c.rate, d, size))
		})
		b.Run(fmt.Sprintf("reader=epoll/conns=%d/rate=%d", c.conns, c.rate), func(b *testing.B) {
			reportFloor(b, epollFloor(b, c.conns, c.rate, d, size))
		})
	}
}

// floorResult is one level's reading: the messages read, over how long, for how much of
// this process's CPU.
type floorResult struct {
	msgs     int64
	wall     time.Duration
	cpu      time.Duration
	measured bool
}

func reportFloor(b *testing.B, r floorResult) {
	if !r.measured {
		b.Skip("SKIP: this reader needs Linux")
	}
	if r.msgs == 0 {
		b.Fatal("wake floor: no message read")
	}
	b.ReportMetric(r.cpu.Seconds()*1e6/float64(r.msgs), "cpu-µs/msg")
	b.ReportMetric(float64(r.msgs)/r.wall.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op") // one op is the whole level: its time means nothing alone
}

// wakeFloorEnv names the writer child's parameters (set only in the child).
const wakeFloorEnv = "KVINDEX_WAKEFLOOR"

// acceptWithin bounds the wait for the writer's connections.
const acceptWithin = 30 * time.Second

// floorWriter is the writer child of one level.
type floorWriter struct {
	cmd    *exec.Cmd
	waited bool
}

// startFloorWriter starts the writer child against addr; the caller defers stop.
func startFloorWriter(b *testing.B, addr string, conns, rate int, d time.Duration, size int) *floorWriter {
	if _, ok := cputime.Process(); !ok {
		b.Skip("SKIP: no process CPU time on this platform")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d,%d", wakeFloorEnv, addr, conns, rate, d.Milliseconds(), size))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return &floorWriter{cmd: cmd}
}

// finish waits for the writer once its connections are read to their ends, and fails
// the level if the writer failed (it wrote fewer messages than the level says).
func (w *floorWriter) finish(b *testing.B) {
	w.waited = true
	if err := w.cmd.Wait(); err != nil {
		b.Fatalf("wake floor writer: %v", err)
	}
}

// stop ends a writer the level did not finish (it failed first).
func (w *floorWriter) stop() {
	if !w.waited {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// netpollFloor runs one level with a goroutine per connection.
func netpollFloor(b *testing.B, conns, rate int, d time.Duration, size int) floorResult {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	wr := startFloorWriter(b, ln.Addr().String(), conns, rate, d, size)
	defer wr.stop()
	// A writer that fails before it has dialled every connection must not leave Accept
	// waiting for ever.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(acceptWithin))
	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	for range conns {
		c, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	counters := make([]frameCounter, len(cs))
	var wg sync.WaitGroup
	start := time.Now()
	cpu0, _ := cputime.Process()
	for i, c := range cs {
		wg.Go(func() {
			buf := make([]byte, 8<<10)
			for {
				n, err := c.Read(buf)
				counters[i].feed(buf[:n])
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	cpu1, _ := cputime.Process()
	wall := time.Since(start)
	wr.finish(b)
	return floorResult{msgs: sumMsgs(counters), wall: wall, cpu: cpu1 - cpu0, measured: true}
}

// sumMsgs is the messages the counters counted.
func sumMsgs(cs []frameCounter) int64 {
	var n int64
	for i := range cs {
		n += cs[i].msgs
	}
	return n
}

// frameCounter counts the whole messages in a stream of ZMTP message frames fed to it
// in pieces of any size.
type frameCounter struct {
	hdr  [9]byte
	nh   int    // header bytes so far
	left uint64 // body bytes of the current frame still to come
	more bool   // the current frame's MORE flag
	msgs int64
}

// feed takes the next piece of the stream.
func (f *frameCounter) feed(p []byte) {
	for len(p) > 0 {
		if f.left > 0 {
			n := min(uint64(len(p)), f.left)
			p, f.left = p[n:], f.left-n
			if f.left == 0 {
				f.endFrame()
			}
			continue
		}
		f.hdr[f.nh] = p[0]
		f.nh, p = f.nh+1, p[1:]
		want := 2
		if f.hdr[0]&flagLong != 0 {
			want = 9
		}
		if f.nh < want {
			continue
		}
		f.more, f.nh = f.hdr[0]&flagMore != 0, 0
		if want == 2 {
			f.left = uint64(f.hdr[1])
		} else {
			f.left = binary.BigEndian.Uint64(f.hdr[1:])
		}
		if f.left == 0 {
			f.endFrame()
		}
	}
}

func (f *frameCounter) endFrame() {
	if !f.more {
		f.msgs++
	}
}

// wakeFloorWriter is the writer child of BenchmarkWakeFloor: it dials the connections
// and writes its messages at the level's rate, each message to the next connection,
// catching up every millisecond, then closes them all. It returns the process's exit code.
func wakeFloorWriter(spec string) int {
	var addr string
	var conns, rate, ms, size int
	fields := strings.Split(spec, ",")
	if len(fields) != 5 {
		fmt.Fprintf(os.Stderr, "wake floor writer: bad spec %q\n", spec)
		return 2
	}
	addr = fields[0]
	for i, p := range []*int{&conns, &rate, &ms, &size} {
		v, err := strconv.Atoi(fields[i+1])
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "wake floor writer: bad spec %q\n", spec)
			return 2
		}
		*p = v
	}
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wake floor writer:", err)
			return 1
		}
		cs[i] = c
	}
	// One message as a vLLM publisher sends it: [topic, 8-byte sequence, payload].
	msg := fakevllm.AppendMessage(nil, []byte("kv@0"), binary.BigEndian.AppendUint64(nil, 1), make([]byte, size))
	start := time.Now()
	end := start.Add(time.Duration(ms) * time.Millisecond)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	sent, next := 0, 0
	for now := range tick.C {
		if now.After(end) {
			break
		}
		for due := int(now.Sub(start).Seconds() * float64(rate)); sent < due; sent++ {
			if _, err := cs[next].Write(msg); err != nil {
				fmt.Fprintln(os.Stderr, "wake floor writer:", err)
				return 1
			}
			next = (next + 1) % conns
		}
	}
	for _, c := range cs {
		_ = c.Close()
	}
	return 0
}

// The ZMTP frame flags the floor's frame counter reads.
const (
	flagMore = 1
	flagLong = 2
)
