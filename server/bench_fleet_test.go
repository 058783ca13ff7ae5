package server_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// BenchmarkMatchFleet measures POST /v1/match in-process against a fleet of 64 and
// 1,000 served engines (added by AddEngine, not started: no subscriber runs) that all
// hold the query's 32 blocks, so that every one is matched and looked up in the fleet
// (its state and trust) per answer. The answer carries the best 4 (top_k): what is
// measured is the per-matched-worker work, not the encoding of 1,000 matches. Trust
// is off, so that workers whose subscribers never ran are scored from the index.
// Besides ns/op it reports the process CPU time per answer, the steadier figure on a
// shared machine (it counts the garbage collector's work too).
func BenchmarkMatchFleet(b *testing.B) {
	for _, n := range []int{64, 1000} {
		b.Run("workers-"+strconv.Itoa(n), func(b *testing.B) {
			s := fleetServer(b, n)
			const blocks = 32
			hs := make([]string, blocks)
			bl := make([]engine.Block, blocks)
			for i := range bl {
				bl[i] = engine.Block{Content: uint64(1000 + i), Seq: uint64(i + 1)}
				hs[i] = strconv.Itoa(1000 + i)
			}
			ns := subscriber.Namespace("m", "")
			for w := range n {
				if err := s.Engine().Apply(&engine.Event{Kind: engine.EventStored, Worker: fleetWorkerID(w), Namespace: ns, Blocks: bl}); err != nil {
					b.Fatal(err)
				}
			}
			body := []byte(`{"model":"m","top_k":4,"content_hashes":[` + strings.Join(hs, ",") + `]}`)
			h := s.Handler()
			b.ReportAllocs()
			c0, _ := cputime.Process()
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/v1/match", bytes.NewReader(body))
				h.ServeHTTP(rec, req)
				if rec.Code != 200 || !bytes.Contains(rec.Body.Bytes(), []byte(`"worker":"pod-`)) {
					b.Fatal(rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(cputime.PerOp(c0, b.N), "cpu-ns/op")
		})
	}
}

// fleetServer returns a server (not started) serving n engines of model "m".
func fleetServer(b *testing.B, n int) *server.Server {
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 16}, Trust: server.TrustConfig{Off: true},
		RuntimeEngines: server.RuntimeEnginesConfig{MaxEngines: n + 1}}, server.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Shutdown(b.Context()) })
	for i := range n {
		if _, _, err := s.AddEngine(server.EngineConfig{Worker: fleetWorkerID(i), Model: "m", BlockSize: 16,
			Endpoint: "tcp://10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":5557"}); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

func fleetWorkerID(i int) string { return "pod-" + strconv.Itoa(i) }
