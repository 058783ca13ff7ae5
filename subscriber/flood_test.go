package subscriber_test

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/subscriber"
)

// procKB reads a "Vm...:  N kB" line of /proc/self/status.
func procKB(t *testing.T, key string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("SKIP (no /proc/self/status): %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("%s not in /proc/self/status", key)
	return 0
}

// TestFloodRSSBounded: a peer floods the subscriber with messages at the cap and
// frame headers far past it (200 MB, as the flood: before the guard one such
// frame took RSS to 227 MB and five to 429 MB, kept after 30 s idle). The process's
// peak RSS stays within floodPeakBound of where it started, and after the flood
// (debug.FreeOSMemory) within floodAfterBound. The flood is counted, not timed: the
// test waits for every message and every refusal. Measured without -race: +56 MB
// peak on a quiet machine, +96.5 MB beside two busy loops (the collector, starved of
// CPU, lets more of the 128 MiB of garbage pile up before it runs), below the start
// after FreeOSMemory. The peak bound, 144 MB, is under one refused header's 200 MB.
func TestFloodRSSBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("SKIP (the race detector's shadow memory dominates RSS): make test runs this test without -race")
	}
	const (
		capBytes        = 1 << 20
		perConn         = 16        // messages at the cap per connection
		conns           = 8         // each ends with a 200 MB header, refused
		floodPeakBound  = 144 << 10 // kB
		floodAfterBound = 24 << 10  // kB
	)
	payload := bytes.Repeat([]byte{0xc1}, capBytes-16) // undecodable: 0xc1 is never used
	var stream []byte
	stream = append(stream, fakevllm.Ready("PUB")...)
	msg := fakevllm.Message([]byte{}, make([]byte, 8), payload)
	for range perConn {
		stream = append(stream, msg...)
	}
	stream = append(stream, fakevllm.LongHeader(0, 200<<20)...)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, conns+8)
	// Registered before runSub, so it runs after the subscriber closed its connections:
	// no goroutine of the hostile server outlives the test.
	var serving sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		serving.Wait()
	})
	s, _ := runSub(t, subscriber.Config{Endpoint: "tcp://" + l.Addr().String(), MaxMessageBytes: capBytes})

	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("SKIP (cannot reset the peak RSS): %v", err)
	}
	base := procKB(t, "VmRSS")
	serving.Add(1)
	go func() {
		defer serving.Done()
		fakevllm.ServeHostile(l, stream, closed)
	}()
	for range conns {
		<-closed
	}
	l.Close()
	waitFor(t, 30*time.Second, "flood received", func() bool {
		st := s.Status()
		return st.PeersRefused >= conns && st.Messages >= conns*perConn
	})
	peak := procKB(t, "VmHWM")
	debug.FreeOSMemory()
	after := procKB(t, "VmRSS")
	t.Logf("RSS: %d kB before, peak %d kB (+%d), %d kB after FreeOSMemory (+%d); %d MiB received, %d x 200 MB headers refused",
		base, peak, peak-base, after, after-base, conns*perConn*capBytes>>20, conns)
	if peak-base > floodPeakBound {
		t.Errorf("peak RSS grew by %d kB, bound %d kB", peak-base, floodPeakBound)
	}
	if after-base > floodAfterBound {
		t.Errorf("RSS after the flood is %d kB above where it started, bound %d kB", after-base, floodAfterBound)
	}
}
