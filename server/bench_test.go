package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber"
)

// BenchmarkMatchHandler measures POST /v1/match in-process (no network): JSON decoding,
// hashing (tokens form), find-matches and encoding, for a 400-block query against 4
// workers that hold it in part (engines without events, their blocks stored directly).
func BenchmarkMatchHandler(b *testing.B) {
	// Four workers fed from elsewhere (as a NATS replica's are), exact: engines
	// without events would be approximate, scored from predictions alone.
	cfg := server.Config{Listen: "127.0.0.1:0", MaxBodyBytes: 8 << 20, Models: map[string]int{"m": 16}}
	index, err := engine.New(engine.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer index.Close()
	s, err := server.New(cfg, server.Options{Index: index})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(b.Context())
	const blocks = 400
	toks := make([]uint32, blocks*16)
	for i := range toks {
		toks[i] = uint32(i / 16 % 50)
	}
	hs := make([]string, blocks)
	var content []uint64
	{
		var err error
		content, err = hashBlocks(toks)
		if err != nil {
			b.Fatal(err)
		}
	}
	for i, h := range content {
		hs[i] = strconv.FormatUint(h, 10)
	}
	ns := subscriber.Namespace("m", "")
	for w := 0; w < 4; w++ {
		bl := make([]engine.Block, blocks*(w+1)/4)
		for i := range bl {
			bl[i] = engine.Block{Content: content[i], Seq: uint64(i + 1)}
		}
		if err := s.Engine().Apply(&engine.Event{Kind: engine.EventStored, Worker: "w" + strconv.Itoa(w), Namespace: ns, Blocks: bl}); err != nil {
			b.Fatal(err)
		}
	}
	tb, _ := json.Marshal(map[string]any{"model": "m", "tokens": toks})
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"hashes", []byte(`{"model":"m","content_hashes":[` + strings.Join(hs, ",") + `]}`)},
		{"tokens", tb},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := s.Handler()
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/v1/match", bytes.NewReader(tc.body))
				h.ServeHTTP(rec, req)
				if rec.Code != 200 || !bytes.Contains(rec.Body.Bytes(), []byte(`"worker":"w3"`)) {
					b.Fatal(rec.Code, rec.Body.String())
				}
			}
		})
	}
}

func hashBlocks(toks []uint32) ([]uint64, error) { return hash.Blocks(nil, toks, 16) }

// BenchmarkSetEngines measures a discovery source's update against a fleet of 2,048
// engines (the server built, not started: no subscriber runs): the whole list applied
// from nothing, and one engine of it replaced (each update plans the source's engines
// against every other one's and publishes a new fleet).
func BenchmarkSetEngines(b *testing.B) {
	const n = 2048
	specs := make([]server.EngineConfig, n)
	for i := range specs {
		specs[i] = server.EngineConfig{Endpoint: "tcp://10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":5557",
			Worker: "pod-" + strconv.Itoa(i), Model: "m", BlockSize: 16}
	}
	newServer := func(b *testing.B) *server.Server {
		s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 16}}, server.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Shutdown(b.Context()) })
		return s
	}
	b.Run("all-2048", func(b *testing.B) {
		s := newServer(b)
		b.ReportAllocs()
		for b.Loop() {
			if ch, err := s.SetEngines("bench", specs); err != nil || len(ch.Added) != n {
				b.Fatal(err, len(ch.Added))
			}
			if _, err := s.SetEngines("bench", nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-of-2048", func(b *testing.B) {
		s := newServer(b)
		if _, err := s.SetEngines("bench", specs); err != nil {
			b.Fatal(err)
		}
		changed := append([]server.EngineConfig(nil), specs...)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			changed[0].Topic = strconv.Itoa(i) // a new spec for pod-0
			i++
			if ch, err := s.SetEngines("bench", changed); err != nil || len(ch.Replaced) != 1 {
				b.Fatal(err, ch.Replaced)
			}
		}
	})
}

// BenchmarkEngineAdd measures one engine added through the admin API (AddEngine) and
// taken out again (RemoveEngine) with 100, 1,000 and 10,000 engines served, all of one
// model (the server built, not started: no subscriber runs). Besides ns/op (an add and
// a remove) it reports the median process CPU time and wall time of the add alone: on
// a shared machine the CPU time is the steadier figure.
func BenchmarkEngineAdd(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run("engines-"+strconv.Itoa(n), func(b *testing.B) {
			s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 16},
				RuntimeEngines: server.RuntimeEnginesConfig{MaxEngines: n + 1}}, server.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Shutdown(b.Context()) })
			for i := range n {
				if _, _, err := s.AddEngine(server.EngineConfig{Worker: "pod-" + strconv.Itoa(i), Model: "m", BlockSize: 16,
					Endpoint: "tcp://10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":5557"}); err != nil {
					b.Fatal(err)
				}
			}
			probe := server.EngineConfig{Worker: "probe", Model: "m", BlockSize: 16, Endpoint: "tcp://10.1.0.1:5557"}
			var cpu, wall []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				c0, _ := cputime.Process()
				w0 := time.Now()
				if _, _, err := s.AddEngine(probe); err != nil {
					b.Fatal(err)
				}
				wall = append(wall, time.Since(w0))
				c1, _ := cputime.Process() // 0 where the platform does not tell
				cpu = append(cpu, c1-c0)
				if _, err := s.RemoveEngine("probe"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(median(cpu).Nanoseconds())/1e3, "p50-cpu-µs/add")
			b.ReportMetric(float64(median(wall).Nanoseconds())/1e3, "p50-wall-µs/add")
		})
	}
}

// median returns the middle of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
