package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/server"
)

// procKB reads a field of /proc/self/status in kB.
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

// TestMemoryBudget drives every client-facing input of serve to its limit at once, for
// two seconds: bodies of the worst-parsing kind (1 MiB of "1," tokens) from more
// clients than the in-flight budget admits, slow bodies that hold their reservation,
// gRPC messages of the worst-decoding kind (1-byte varint hashes) and gRPC calls that
// declare a message and never send it, predictions in a new 900-byte namespace each,
// and more connections than the limit, after routed requests were tracked under
// 256-byte request ids up to routing.max_in_flight and engines with the longest names
// added up to runtime_engines.max_engines. The peak RSS stays under server.Budget of the
// configuration (budget.go). Not under the race detector, whose shadow memory is
// several times the heap: make race runs it without.
func TestMemoryBudget(t *testing.T) {
	if raceEnabled {
		t.Skip("SKIP under the race detector (make race runs it without)")
	}
	cfg := server.Config{Listen: "127.0.0.1:0", MaxBodyBytes: 1 << 20, MaxMatches: 64,
		Engines: []server.EngineConfig{{Worker: "w", Model: "m", BlockSize: 4}},
		GRPC:    server.GRPCConfig{Listen: "127.0.0.1:0", MaxMessageBytes: 1 << 20},
		Limits:  server.LimitsConfig{MaxConnections: 64, InFlightBytes: 8 << 20, ConnInFlightBytes: 2 << 20},
		Index:   server.IndexConfig{PredictedBlocks: 1 << 16, NamespaceBytes: 2 << 20},
		Routing: server.RoutingConfig{MaxInFlight: 1 << 13}, RuntimeEngines: server.RuntimeEnginesConfig{MaxEngines: 64}}
	budget := server.Budget(cfg)
	s, c := start(t, cfg)
	c.waitReady(t)
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("SKIP (cannot reset the peak RSS): %v", err)
	}
	base := procKB(t, "VmRSS")
	fillTracking(t, c, 1<<13, 64)
	stop := startAttack(t, s, c)
	time.Sleep(2 * time.Second) // the length of the attack, not a synchronisation
	res := stop()
	peak := procKB(t, "VmHWM")
	grew := (peak - base) << 10
	t.Logf("RSS %d kB before, peak %d kB (+%.1f MiB); budget %v", base, peak, float64(grew)/(1<<20), budget)
	t.Logf("attack: %v", res)
	if grew > budget.Total() {
		t.Fatalf("peak RSS grew by %d bytes, over the budget's %d", grew, budget.Total())
	}
	if st := s.Engine().Stats(); st.NamespaceBytes > 2<<20 {
		t.Fatalf("namespace table holds %d bytes", st.NamespaceBytes)
	}
}

// fillTracking tracks routed requests under the longest request ids up to their bound,
// and adds engines with the longest names up to theirs; one more of each is refused.
func fillTracking(t *testing.T, c *client, requests, engines int) {
	t.Helper()
	for i := range requests + 1 {
		want := 200
		if i == requests {
			want = 503
		}
		var e struct{ Code string }
		if code := c.do("POST", "/v1/routed", fmt.Sprintf(`{"model":"m","worker":"w","content_hashes":[1],"request_id":"%0256d"}`, i), &e); code != want {
			t.Fatalf("routed request %d: %d %s, want %d", i, code, e.Code, want)
		}
	}
	for i := range engines {
		want := 201
		if i == engines-1 { // the configured engine is one of them
			want = 400
		}
		var e struct{ Code, Error string }
		if code := c.do("POST", "/v1/engines", fmt.Sprintf(`{"worker":"%0256d","model":"%0255dm","block_size":4}`, i, i), &e); code != want {
			t.Fatalf("engine %d: %d %+v, want %d", i, code, e, want)
		}
	}
}

// startAttack drives every client-facing input of s to its limit from goroutines (see
// TestMemoryBudget) until the returned function is called; that function stops them and
// says what was answered and what was shed.
func startAttack(t *testing.T, s *server.Server, c *client) (stop func() string) {
	t.Helper()
	addr := s.Addr()
	grpcConn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(2<<20)))
	if err != nil {
		t.Fatal(err)
	}
	idx := kvindexv1.NewIndexClient(grpcConn)

	tokens := "{\"model\":\"m\",\"tokens\":[" + strings.Repeat("1,", (1<<20-40)/2) + "1]}"
	hashes := make([]uint64, (1<<20-64)/2) // 1-byte varints, a tag per packed run: ~1 MiB

	done := make(chan struct{})
	var wg sync.WaitGroup
	loop := func(n int, f func(i int)) {
		for i := range n {
			wg.Go(func() {
				for j := 0; ; j++ {
					select {
					case <-done:
						return
					default:
					}
					f(i*1_000_000 + j)
				}
			})
		}
	}
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 32}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var shed, ok sync.Map
	count := func(m *sync.Map, k string) { v, _ := m.LoadOrStore(k, new(int)); *(v.(*int))++ }
	var mu sync.Mutex
	post := func(path, body string) {
		resp, err := hc.Post("http://"+addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			return // a connection past the limit, closed on accept
		}
		resp.Body.Close()
		mu.Lock()
		if resp.StatusCode == 429 || resp.StatusCode == 503 {
			count(&shed, path)
		} else {
			count(&ok, fmt.Sprint(path, " ", resp.StatusCode))
		}
		mu.Unlock()
	}
	loop(24, func(int) { post("/v1/match", tokens) })
	loop(2, func(i int) {
		post("/v1/routed", fmt.Sprintf(`{"model":"m","worker":"w","content_hashes":[1,2,3],"ttl_ms":1,"cache_salt":"%0900d"}`, i))
	})
	loop(8, func(int) {
		_, _ = idx.Match(context.Background(), &kvindexv1.MatchRequest{Model: "m", ContentHashes: hashes})
	})
	for range 6 { // slow bodies and silent gRPC calls hold their reservations
		holdBody(t, strings.TrimPrefix(c.base, "http://"), 1<<20)
	}
	for range 3 {
		g := dialGRPCRaw(t, s.GRPCAddr())
		g.open(1 << 20)
		g.open(1 << 20)
	}
	// The clients hold their connections before the extra ones take the rest.
	deadline := time.Now().Add(10 * time.Second)
	for answered := 0; answered == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // bounded poll of a condition
		mu.Lock()
		shed.Range(func(any, any) bool { answered++; return false })
		ok.Range(func(any, any) bool { answered++; return false })
		mu.Unlock()
	}
	var extra []net.Conn
	for range 100 {
		if conn, err := net.Dial("tcp", addr); err == nil {
			extra = append(extra, conn)
		}
	}
	return func() string {
		close(done)
		wg.Wait()
		for _, conn := range extra {
			conn.Close()
		}
		tr.CloseIdleConnections()
		grpcConn.Close()
		var b strings.Builder
		mu.Lock()
		defer mu.Unlock()
		ok.Range(func(k, v any) bool { fmt.Fprintf(&b, "answered %v: %d; ", k, *(v.(*int))); return true })
		shed.Range(func(k, v any) bool { fmt.Fprintf(&b, "shed %v: %d; ", k, *(v.(*int))); return true })
		return b.String()
	}
}
