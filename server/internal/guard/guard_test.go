package guard

import (
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSharesAgainstModel: random takes and gives of a few clients agree with a plain
// map of what each holds, and an entry is gone once its client holds nothing.
func TestSharesAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := NewShares(100)
	type hold struct {
		client string
		n      int64
	}
	var held []hold
	model := map[string]int64{}
	for range 10000 {
		if len(held) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(held))
			h := held[i]
			held = append(held[:i], held[i+1:]...)
			s.Give(h.client, h.n)
			if model[h.client] -= h.n; model[h.client] == 0 {
				delete(model, h.client)
			}
			continue
		}
		c, n := string(rune('a'+rng.IntN(4))), int64(1+rng.IntN(60))
		want := model[c]+n <= 100
		if got := s.Take(c, n); got != want {
			t.Fatalf("Take(%s, %d) = %v with %d held", c, n, got, model[c])
		}
		if want {
			model[c] += n
			held = append(held, hold{c, n})
		}
		for c, v := range model {
			if s.Used(c) != v {
				t.Fatalf("%s holds %d, want %d", c, s.Used(c), v)
			}
		}
	}
	for _, h := range held {
		s.Give(h.client, h.n)
	}
	if s.Clients() != 0 {
		t.Fatalf("%d clients left holding nothing", s.Clients())
	}
}

// TestBudgetConcurrent: takes and gives from many goroutines never exceed the limit
// and leave nothing behind (run under -race).
func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(10)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if b.Take(3) {
					if u := b.Used(); u > 10 {
						t.Errorf("used %d past 10", u)
					}
					b.Give(3)
				}
			}
		}()
	}
	wg.Wait()
	if b.Used() != 0 {
		t.Fatalf("used %d after all gave back", b.Used())
	}
}

// listen is a Listener on loopback whose accepted connections are sent on a channel;
// shed reasons are counted.
func listen(t *testing.T, cfg ListenerConfig) (*Listener, <-chan net.Conn, func() map[string]int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	shed := map[string]int{}
	cfg.Shed = func(r string) { mu.Lock(); shed[r]++; mu.Unlock() }
	l := NewListener(ln, cfg)
	ch := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for c := range ch {
			c.Close()
		}
	})
	return l, ch, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return map[string]int{"src": shed[ShedSourceConnections], "unauth": shed[ShedUnauthenticated], "all": shed[ShedConnections], "hs": shed[ShedHandshake]}
	}
}

func dialFrom(t *testing.T, ip byte, addr string) net.Conn {
	t.Helper()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer reports whether the server side closed c (EOF or reset within 10 s).
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

// TestListenerBounds: a source past its slots, and connections past the unauthenticated
// bound, are closed on accept; an authenticated connection frees an unauthenticated
// slot and outlives the handshake window; the others are closed when it ends; closing
// gives every slot back.
func TestListenerBounds(t *testing.T) {
	l, acc, shed := listen(t, ListenerConfig{Max: 10, PerSource: 2, Unauthenticated: 3, Handshake: 300 * time.Millisecond})
	a1, a2 := dialFrom(t, 2, l.Addr().String()), dialFrom(t, 2, l.Addr().String())
	first := <-acc
	<-acc
	a3 := dialFrom(t, 2, l.Addr().String()) // the source's third
	if !closedByPeer(a3) {
		t.Fatal("a source's third connection was kept")
	}
	if !l.Authenticated(first.RemoteAddr().String()) {
		t.Fatal("Authenticated did not find an open connection")
	}
	b1, b2 := dialFrom(t, 3, l.Addr().String()), dialFrom(t, 4, l.Addr().String())
	<-acc
	<-acc
	b3 := dialFrom(t, 5, l.Addr().String()) // the fourth unauthenticated
	if !closedByPeer(b3) {
		t.Fatal("a connection past the unauthenticated bound was kept")
	}
	for _, c := range []net.Conn{b1, b2} { // closed when the window ends
		if !closedByPeer(c) {
			t.Fatal("an unauthenticated connection outlived the window")
		}
	}
	// The source's other connection never authenticated: closed when the window ends too
	// (waited for, so that Open counts only the authenticated one).
	other := a1
	if first.RemoteAddr().String() == a1.LocalAddr().String() {
		other = a2
	}
	if !closedByPeer(other) {
		t.Fatal("the source's unauthenticated connection outlived the window")
	}
	if got := shed(); got["src"] != 1 || got["unauth"] != 1 || got["hs"] < 2 {
		t.Fatalf("shed %v", got)
	}
	if l.Authenticated("127.0.0.9:1") {
		t.Fatal("Authenticated found a connection never opened")
	}
	first.Write([]byte("x")) // the authenticated one is still open
	if n := l.Open(); n != 1 {
		t.Fatalf("%d open after the window, want the authenticated one", n)
	}
	first.Close()
	if n := l.Open(); n != 0 {
		t.Fatalf("%d open after all closed", n)
	}
}

// TestBodyRateDeadline: a read's deadline is the body's schedule, never more than the
// grace from now.
func TestBodyRateDeadline(t *testing.T) {
	r := BodyRate{MinRate: 1000, Grace: time.Second}
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		now  time.Duration
		read int64
		want time.Duration
	}{
		{0, 0, time.Second},    // the first byte: the grace from now, before the schedule
		{0, 5000, time.Second}, // far ahead of schedule: the grace from now
		{3 * time.Second, 1000, 2*time.Second + time.Millisecond}, // behind: the schedule, already past
	} {
		if got := r.deadline(t0, t0.Add(c.now), c.read).Sub(t0); got != c.want {
			t.Errorf("now %v read %d: deadline %v, want %v", c.now, c.read, got, c.want)
		}
	}
	var set []time.Time
	rd := r.Reader(strings.NewReader("abc"), func(d time.Time) error { set = append(set, d); return nil }, func() time.Time { return t0 })
	if b, _ := io.ReadAll(rd); string(b) != "abc" || len(set) < 1 {
		t.Fatalf("read %q, %d deadlines", b, len(set))
	}
}

// TestTokens: a file other users can read is refused; tokens match by value only.
func TestTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode uint32) string {
		p := dir + "/" + name
		if err := writeFileMode(p, body, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := ReadTokens(write("open", "a-token-of-sixteen-bytes\n", 0o644)); err == nil || !strings.Contains(err.Error(), "other users") {
		t.Fatalf("a world-readable file: %v", err)
	}
	toks, err := ReadTokens(write("ok", "# c\n\na-token-of-sixteen-bytes\n", 0o600))
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"Bearer a-token-of-sixteen-bytes": true, "Bearer a-token-of-sixteen-byte": false, "a-token-of-sixteen-bytes": false} {
		if toks.Bearer(v) != want {
			t.Errorf("Bearer(%q) != %v", v, want)
		}
	}
	var none *Tokens
	if none.Bearer("Bearer x") || none.Len() != 0 {
		t.Fatal("nil tokens accept")
	}
	if _, err := ReadTokens(write("short", "short\n", 0o600)); err == nil {
		t.Fatal("a short token accepted")
	}
}
