package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// holdBody opens a connection to addr and sends a request declaring a body of n bytes
// whose first byte only it sends: the server holds the request, and its reservation,
// until the connection closes. It returns the connection.
func holdBody(t *testing.T, addr string, n int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/match HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", n)
	return c
}

// metric reads one series' value from /metrics (-1 when absent).
func metric(c *client, series string) float64 {
	for _, line := range strings.Split(c.text("/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// waitMetric polls /metrics until series has value want.
func waitMetric(t *testing.T, c *client, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metric(c, series) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", series, metric(c, series), want)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
	}
}

// TestHTTPInFlightBudget: slow 1 MiB bodies (a client that declares the body and sends
// one byte) each hold their reservation; once the server's budget (4 MiB here) is
// taken, the next request with a body is refused at once with 503 and Retry-After,
// without a byte of it read, while requests without a body and the held ones' peers are
// untouched. Before, 1,000 such bodies held 2.7 GB for 30 s. Closing them gives the
// budget back.
func TestHTTPInFlightBudget(t *testing.T) {
	_, c := start(t, server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		Limits: server.LimitsConfig{InFlightBytes: 4 << 20, ConnInFlightBytes: 2 << 20, ClientInFlightBytes: 4 << 20, BodyGrace: server.Duration(time.Minute)}})
	c.waitReady(t)
	addr := strings.TrimPrefix(c.base, "http://")
	var held []net.Conn
	for range 4 {
		held = append(held, holdBody(t, addr, 1<<20))
	}
	waitMetric(t, c, "kvindex_in_flight_bytes", 4<<20)
	var e struct{ Error, Message string }
	resp, err := http.Post(c.base+"/v1/match", "application/json", strings.NewReader(`{"model":"m","content_hashes":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !bytes.Contains(b, []byte("overloaded")) {
		t.Fatalf("past the budget: %d %q (Retry-After %q)", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if code := c.do("GET", "/v1/workers", "", nil); code != 200 {
		t.Fatalf("a request without a body: %d", code)
	}
	if got := metric(c, `kvindex_requests_shed_total{api="http",reason="server_budget"}`); got != 1 {
		t.Fatalf("shed counter %v, want 1", got)
	}
	for _, h := range held {
		h.Close()
	}
	waitMetric(t, c, "kvindex_in_flight_bytes", 0)
	if code := c.do("POST", "/v1/match", `{"model":"m","content_hashes":[1]}`, &e); code != 200 {
		t.Fatalf("after the slow bodies left: %d %+v", code, e)
	}
}

// TestConnectionLimit: past limits.max_connections, a connection is closed as soon as
// it is accepted (and counted); the open ones keep working.
func TestConnectionLimit(t *testing.T) {
	_, c := start(t, server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		Limits: server.LimitsConfig{MaxConnections: 3, MaxUnauthenticatedConnections: 3}})
	c.waitReady(t) // the client's own keep-alive connection is one
	addr := strings.TrimPrefix(c.base, "http://")
	for range 2 {
		holdBody(t, addr, 10)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if n, err := extra.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a connection past the limit was served (%d bytes)", n)
	}
	if got := metric(c, `kvindex_requests_shed_total{api="http",reason="connections"}`); got < 1 {
		t.Fatalf("shed counter %v", got)
	}
}

// grpcRaw is an HTTP/2 connection to a gRPC server written frame by frame, as a hostile
// client would.
type grpcRaw struct {
	t     *testing.T
	conn  net.Conn
	fr    *http2.Framer
	hbuf  bytes.Buffer
	enc   *hpack.Encoder
	dec   *hpack.Decoder
	next  uint32
	token string            // sent as a bearer token when set
	ended map[uint32]string // the streams read ended, with their grpc-status ("" reset)
}

func dialGRPCRaw(t *testing.T, addr string) *grpcRaw {
	t.Helper()
	return dialGRPCRawFrom(t, addr, nil)
}

// dialGRPCRawFrom is dialGRPCRaw from a local address (nil: any).
func dialGRPCRawFrom(t *testing.T, addr string, local net.Addr) *grpcRaw {
	t.Helper()
	conn, err := (&net.Dialer{LocalAddr: local}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	g := &grpcRaw{t: t, conn: conn, fr: http2.NewFramer(conn, bufio.NewReader(conn)), next: 1,
		dec: hpack.NewDecoder(4096, nil), ended: map[uint32]string{}}
	g.enc = hpack.NewEncoder(&g.hbuf)
	if err := g.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return g
}

// open starts a Match call whose message declares n bytes and sends only its prefix.
func (g *grpcRaw) open(n uint32) uint32 {
	g.t.Helper()
	id := g.next
	g.next += 2
	g.hbuf.Reset()
	fields := [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/kvindex.v1.Index/Match"},
		{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}}
	if g.token != "" {
		fields = append(fields, [2]string{"authorization", "Bearer " + g.token})
	}
	for _, f := range fields {
		_ = g.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: g.hbuf.Bytes(), EndHeaders: true}); err != nil {
		g.t.Fatal(err)
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], n)
	if err := g.fr.WriteData(id, false, prefix[:]); err != nil {
		g.t.Fatal(err)
	}
	return id
}

// status reads frames until stream id ends and returns its grpc-status ("" if the
// stream was reset). Every header block is decoded, whichever stream it is on: HPACK's
// table is the connection's.
func (g *grpcRaw) status(id uint32) string {
	g.t.Helper()
	for {
		if st, ok := g.ended[id]; ok {
			return st
		}
		f, err := g.fr.ReadFrame()
		if err != nil {
			g.t.Fatalf("stream %d: %v", id, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = g.fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			g.ended[f.StreamID] = ""
		case *http2.HeadersFrame:
			fields, err := g.dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				g.t.Fatal(err)
			}
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					g.ended[f.StreamID] = hf.Value
				}
			}
		}
	}
}

// TestGRPCInFlightBudget: calls whose message declares the largest size and never
// finishes (128 of them held ~530 MB per connection, 4 connections 2.1 GB) each hold
// a reservation: the server advertises as many concurrent streams as the connection's
// budget holds largest messages (2 here), so a client that opens a third is refused by
// the transport (RST_STREAM), and past the server's budget a call is refused with
// UNAVAILABLE, before grpc-go allocates its message; closing the connections gives
// everything back.
func TestGRPCInFlightBudget(t *testing.T) {
	index, err := engine.New(engine.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		GRPC:   server.GRPCConfig{Listen: "127.0.0.1:0", MaxMessageBytes: 1 << 20},
		Limits: server.LimitsConfig{InFlightBytes: 3 << 20, ConnInFlightBytes: 2 << 20, ClientInFlightBytes: 3 << 20}}, server.Options{Index: index})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c := newClient(t, s.Addr())
	a := dialGRPCRaw(t, s.GRPCAddr())
	a.open(1 << 20)
	a.open(1 << 20)
	if got := a.status(a.open(1 << 20)); got != "" { // refused: past the advertised streams
		t.Fatalf("a third call on a connection holding 2 MiB: status %q, want the stream reset", got)
	}
	b := dialGRPCRaw(t, s.GRPCAddr())
	b.open(1 << 20)
	if got := b.status(b.open(1 << 20)); got != "14" { // UNAVAILABLE
		t.Fatalf("a call past the server's 3 MiB: status %q, want 14", got)
	}
	waitMetric(t, c, "kvindex_in_flight_bytes", 3<<20)
	for _, want := range []string{`{api="grpc",reason="server_budget"} 1`} {
		if !strings.Contains(c.text("/metrics"), "kvindex_requests_shed_total"+want) {
			t.Fatalf("metrics lack kvindex_requests_shed_total%s", want)
		}
	}
	a.conn.Close()
	b.conn.Close()
	waitMetric(t, c, "kvindex_in_flight_bytes", 0)
}

// TestMatchTopK: /v1/match and gRPC Match answer at most max_matches matches, best
// first, and fewer with top_k; matches_total says how many workers matched, and the
// pick is made from all of them. Before, every matching worker was in every answer (a
// 5.4 MB answer at 50,000 workers).
func TestMatchTopK(t *testing.T) {
	f := startGRPC(t, server.Config{MaxMatches: 3})
	ns := subscriber.Namespace("m", "")
	for w := range 5 {
		var blocks []engine.Block
		for i := 0; i <= w; i++ {
			blocks = append(blocks, engine.Block{Content: uint64(i + 1), Seq: uint64(i + 1)})
		}
		if err := f.index.Apply(&engine.Event{Kind: engine.EventStored, Worker: fmt.Sprintf("w%d", w), Namespace: ns, Blocks: blocks}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.index.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	q := []uint64{1, 2, 3, 4, 5}
	for _, c := range []struct {
		topK  uint32
		names []string
	}{{0, []string{"w4", "w3", "w2"}}, {2, []string{"w4", "w3"}}, {9, []string{"w4", "w3", "w2"}}} {
		var got server.MatchResponse
		body := fmt.Sprintf(`{"model":"m","content_hashes":[1,2,3,4,5],"top_k":%d}`, c.topK)
		if code := f.http.do("POST", "/v1/match", body, &got); code != 200 {
			t.Fatalf("top_k %d: %d", c.topK, code)
		}
		g, err := f.raw.Match(context.Background(), &kvindexv1.MatchRequest{Model: "m", ContentHashes: q, TopK: c.topK})
		if err != nil {
			t.Fatal(err)
		}
		if got.MatchesTotal != 5 || g.GetMatchesTotal() != 5 || len(got.Matches) != len(c.names) || len(g.GetMatches()) != len(c.names) {
			t.Fatalf("top_k %d: %d of %d over HTTP, %d of %d over gRPC", c.topK, len(got.Matches), got.MatchesTotal, len(g.GetMatches()), g.GetMatchesTotal())
		}
		for i, name := range c.names {
			if got.Matches[i].Worker != name || g.GetMatches()[i].GetWorker() != name {
				t.Fatalf("top_k %d: match %d is %s / %s, want %s", c.topK, i, got.Matches[i].Worker, g.GetMatches()[i].GetWorker(), name)
			}
		}
		if got.Pick == nil || got.Pick.Worker != "w4" {
			t.Fatalf("pick %+v", got.Pick)
		}
	}
	var e struct{ Error, Code string }
	if code := f.http.do("POST", "/v1/match", `{"model":"m","content_hashes":[1],"top_k":-1}`, &e); code != 400 {
		t.Fatalf("top_k -1: %d %+v", code, e)
	}
}

// TestGRPCClientQueuesPastStreams: one client connection with more calls in flight than
// the connection's budget holds largest messages (16 at once, 4 advertised streams with
// the default budget and message bound) gets every answer: grpc-go's client queues the
// calls past the advertised streams, and a call's reservation is returned before its
// answer is written, so the next call never finds it still held. Before, 4 concurrent
// calls on one connection were refused now and then (bench/loadgen's smoke test).
func TestGRPCClientQueuesPastStreams(t *testing.T) {
	f := startGRPC(t, server.Config{})
	const calls, rounds = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				if _, err := f.raw.Match(context.Background(), &kvindexv1.MatchRequest{Model: "m", ContentHashes: []uint64{1, 2, 3}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestLongNamespaceRefused: a cache salt (or LoRA name, or namespace) that makes a
// namespace longer than engine.MaxNamespaceLen is refused with 400 before anything is
// built from it (a salt of 400,000 ';' escaped to 1.2 MB, was interned for good, written
// into the snapshot, and made the next restart refuse it); the namespace table shows in
// /metrics.
func TestLongNamespaceRefused(t *testing.T) {
	_, c := start(t, server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Worker: "w", Model: "m", BlockSize: 4}}})
	c.waitReady(t)
	var e struct{ Error, Code string }
	for _, salt := range []string{strings.Repeat(";", 400000), strings.Repeat("s", engine.MaxNamespaceLen)} {
		body := fmt.Sprintf(`{"model":"m","worker":"w","content_hashes":[1],"cache_salt":%q}`, salt)
		if code := c.do("POST", "/v1/routed", body, &e); code != 400 || e.Code != "bad_namespace" {
			t.Fatalf("salt of %d bytes: %d %+v", len(salt), code, e)
		}
	}
	if code := c.do("POST", "/v1/routed", `{"model":"m","worker":"w","content_hashes":[1],"cache_salt":"ok"}`, &e); code != 200 {
		t.Fatalf("a short salt: %d %+v", code, e)
	}
	if got := metric(c, "kvindex_index_namespaces"); got != 1 {
		t.Fatalf("kvindex_index_namespaces %v, want 1", got)
	}
}
