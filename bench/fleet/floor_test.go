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
// machine, whatever the index and the decoder cost: the process's CPU to read lone
// messages from many loopback connections and do nothing with them, with serve's way of
// reading and with the other ways Linux offers. A child process (this test binary again,
// wakeFloorWriter) dials conns connections and writes rate messages a second over all of
// them in turn (what is due, every millisecond), each message three frames as a vLLM
// publisher sends (topic, 8-byte sequence, a payload of 1,000 bytes), for 5 seconds, and
// this process reads them:
//
//   - reader=netpoll: serve's way: a goroutine per connection reads what has arrived
//     into an 8 KiB buffer (as the ZMTP guard's buffered reader fills), parking in Go's
//     netpoller when the connection is drained: each lone message costs a wake-up of its
//     goroutine and two reads (the message, then EAGAIN).
//   - reader=epoll (Linux): one goroutine on a locked thread waits in epoll_wait on every
//     connection (sockets Go's netpoller does not know) and reads each ready one once:
//     one read per message and one wait per wake-up, shared by the connections ready
//     together. reader=epoll-2ms and -10ms sleep that long (nanosleep) after each round
//     of reads before they look again, so that more messages wait for each wake-up: the
//     window a reader would add to the apply lag.
//   - reader=uring-* (Linux): one io_uring with a receive queued per connection into its
//     own buffer; a wait submits the receives of the connections just read and reaps
//     the completions: no read system call per message. uring-defer runs the kernel's
//     completion work only in the reader's own waits (IORING_SETUP_DEFER_TASKRUN, on a
//     locked thread), uring-coop without interrupting the reader for it
//     (IORING_SETUP_COOP_TASKRUN), uring-plain as the kernel's default; each with the
//     windows of the epoll loop.
//
// cpu-µs/msg is this process's CPU time (user and system) over the messages read: the
// reads, the waits and the scheduler's wake-ups, nothing else. Every level must read every
// message the writer wrote. kvindex loadtest --engines 64 at 8,000 batches/s is the first
// case (its batches: 13 stored blocks of 16 tokens and 13 removed, about 1 KB); the other
// readers and windows run in that case only.
//
// One measurement per benchmark run, whatever b.N: use -benchtime 1x.
func BenchmarkWakeFloor(b *testing.B) {
	const d, size = 5 * time.Second, 1000
	for i, c := range []struct{ conns, rate int }{{64, 8000}, {8, 8000}, {64, 2000}} {
		level := func(reader string, run func(b *testing.B) floorResult) {
			b.Run(fmt.Sprintf("reader=%s/conns=%d/rate=%d", reader, c.conns, c.rate), func(b *testing.B) {
				reportFloor(b, run(b))
			})
		}
		level("netpoll", func(b *testing.B) floorResult { return netpollFloor(b, c.conns, c.rate, d, size) })
		level("epoll", func(b *testing.B) floorResult { return epollFloor(b, c.conns, c.rate, d, size, 0) })
		if i > 0 {
			continue
		}
		windows := []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond}
		for _, w := range windows[1:] {
			level("epoll-"+windowName(w), func(b *testing.B) floorResult { return epollFloor(b, c.conns, c.rate, d, size, w) })
		}
		for _, m := range uringModes {
			for _, w := range windows {
				name := "uring-" + m.name
				if w > 0 {
					name += "-" + windowName(w)
				}
				level(name, func(b *testing.B) floorResult { return uringFloor(b, c.conns, c.rate, d, size, w, m.flags) })
			}
		}
	}
}

// BenchmarkSleepWake measures what one wake-up from a sleep costs this process, by the
// kernel's accounting of its CPU: a thread sleeps window (nanosleep) for 2 seconds, over
// and over, doing nothing else. A reader that waits for its window between rounds of
// reads pays it once a round (BenchmarkWakeFloor's windowed readers).
//
// One measurement per benchmark run, whatever b.N: use -benchtime 1x.
func BenchmarkSleepWake(b *testing.B) {
	for _, w := range []time.Duration{100 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 10 * time.Millisecond} {
		b.Run("window="+windowName(w), func(b *testing.B) {
			wakes, cpu, ok := sleepWakes(w, 2*time.Second)
			if !ok {
				b.Skip("SKIP: needs Linux and the process's CPU time")
			}
			b.ReportMetric(cpu.Seconds()*1e6/float64(wakes), "cpu-µs/wake")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// windowName is a window as a level's name gives it ("2ms", "100us").
func windowName(w time.Duration) string { return strings.ReplaceAll(w.String(), "µ", "u") }

// floorResult is one level's reading: the messages read and written, over how long, for
// how much of this process's CPU.
type floorResult struct {
	msgs     int64
	sent     int64 // what the writer says it wrote
	wall     time.Duration
	cpu      time.Duration
	measured bool
}

func reportFloor(b *testing.B, r floorResult) {
	if !r.measured {
		b.Skip("SKIP: this reader needs Linux")
	}
	if r.msgs == 0 || r.msgs != r.sent {
		b.Fatalf("wake floor: read %d messages of the %d written", r.msgs, r.sent)
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
	out    strings.Builder // the writer's standard output: "sent N"
	waited bool
}

// startFloorWriter starts the writer child against addr; the caller defers stop.
func startFloorWriter(b *testing.B, addr string, conns, rate int, d time.Duration, size int) *floorWriter {
	if _, ok := cputime.Process(); !ok {
		b.Skip("SKIP: no process CPU time on this platform")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d,%d", wakeFloorEnv, addr, conns, rate, d.Milliseconds(), size))
	w := &floorWriter{cmd: cmd}
	cmd.Stdout, cmd.Stderr = &w.out, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return w
}

// finish waits for the writer once its connections are read to their ends and returns
// the messages it wrote; it fails the level if the writer failed.
func (w *floorWriter) finish(b *testing.B) int64 {
	w.waited = true
	if err := w.cmd.Wait(); err != nil {
		b.Fatalf("wake floor writer: %v", err)
	}
	var sent int64
	if _, err := fmt.Sscanf(w.out.String(), "sent %d", &sent); err != nil {
		b.Fatalf("wake floor writer: %q: %v", w.out.String(), err)
	}
	return sent
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
	sent := wr.finish(b)
	return floorResult{msgs: sumMsgs(counters), sent: sent, wall: wall, cpu: cpu1 - cpu0, measured: true}
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
	fmt.Printf("sent %d\n", sent)
	return 0
}

// The ZMTP frame flags the floor's frame counter reads.
const (
	flagMore = 1
	flagLong = 2
)
