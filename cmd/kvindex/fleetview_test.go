package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/fabric"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/internal/natstest"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/server"
)

// startNATSServer is relayNATS with the server's handle (to stop it mid-test), with or
// without JetStream.
func startNATSServer(t *testing.T, jetStream bool) *natstest.Server {
	t.Helper()
	return natstest.Start(t, natstest.Options{JetStream: jetStream})
}

// waitExit waits for a background command's exit code; a command still running after
// a minute has hung, which is what the test is about.
func waitExit(t *testing.T, done <-chan int, what string, stderr *syncBuffer) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(time.Minute):
		t.Fatalf("%s still running after a minute; stderr %q", what, stderr.String())
		return 0
	}
}

// TestRelayFailsFast: a relay whose NATS server is down, or has no JetStream, retries
// for --connect-timeout and exits 1 saying why, instead of waiting silently (it used to
// print nothing for as long as it ran).
func TestRelayFailsFast(t *testing.T) {
	noJS := startNATSServer(t, false)
	for _, c := range []struct {
		name, url string
		want      []string
	}{
		{"unreachable", "nats" + strings.TrimPrefix(freeport.Endpoint(t), "tcp"), []string{"no NATS server at", "attempts", "no servers available"}},
		{"no-jetstream", noJS.URL(), []string{"creating stream KVINDEX at " + noJS.URL(), "is JetStream enabled"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut syncBuffer
			done, _ := background(t, func(ctx context.Context) int {
				return relayMain(ctx, []string{"--nats", c.url, "--ops", "../../testdata/demo.jsonl", "--connect-timeout", "1s", "--log-level", "error"}, &out, &errOut)
			})
			if code := waitExit(t, done, "relay", &errOut); code != 1 {
				t.Fatalf("exit %d, want 1; stderr %q", code, errOut.String())
			}
			for _, w := range c.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr %q does not say %q", errOut.String(), w)
				}
			}
		})
	}
}

// scrape reads a /metrics page into series -> value ("name{labels}" as printed).
func scrape(t *testing.T, hc *http.Client, url string) map[string]float64 {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s: status %d, %v", url, resp.StatusCode, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// getJSON GETs url into v and returns the status.
func getJSON(t *testing.T, hc *http.Client, url string, v any) int {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}

// poll retries cond (bounded) until it holds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond) // bounded poll of a condition
	}
}

// TestRelayHealthAndMetrics: `kvindex relay --engine ... --listen` in front of a
// simulated vLLM engine (package bench/fleet's ZMTP PUB and ROUTER) serves /healthz,
// /readyz and /metrics: what it published equals what the stream holds and the
// events it handed over, its worker is live at the engine's last sequence; with the
// NATS server gone /readyz says it waits for NATS while /healthz stays up.
func TestRelayHealthAndMetrics(t *testing.T) {
	ns := startNATSServer(t, true)
	fl, err := fakevllm.NewFleet(fakevllm.FleetConfig{Engines: 1, Drivers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	pub, rep := fl.Endpoints(0)
	worker := fakevllm.WorkerName(0)
	spec := fmt.Sprintf("endpoint=%s,replay=%s,worker=%s,model=%s,block_size=16", pub, rep, worker, fakevllm.Model)
	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return relayMain(ctx, []string{"--nats", ns.URL(), "--memory", "--engine", spec, "--listen", "127.0.0.1:0", "--log-level", "warn"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	base := "http://" + addr

	var ready struct {
		Ready   bool     `json:"ready"`
		Waiting []string `json:"waiting"`
	}
	poll(t, "relay ready", func() bool { return getJSON(t, hc, base+"/readyz", &ready) == 200 && ready.Ready })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fl.Drive(ctx, 400, 300*time.Millisecond, false)
	batches := fl.Counts()[0].Batches
	if batches == 0 {
		t.Fatal("the engine published nothing")
	}
	lastSeq := fmt.Sprintf(`kvindex_worker_last_seq{worker=%q}`, worker)
	var m map[string]float64
	poll(t, "relay at the engine's last batch", func() bool {
		m = scrape(t, hc, base+"/metrics")
		return m[lastSeq] == float64(batches-1)
	})
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := nc.JetStream()
	info, err := js.StreamInfo(fabric.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	events := 0.0
	for _, k := range []string{"stored", "removed", "cleared", "copied"} {
		events += m[fmt.Sprintf(`kvindex_events_applied_total{kind=%q,worker=%q}`, k, worker)]
	}
	if got := m["kvindex_relay_published_total"]; got != float64(info.State.Msgs) || got != events || got < float64(batches) {
		t.Fatalf("published %v, the stream holds %d, events handed over %v, batches %d", got, info.State.Msgs, events, batches)
	}
	for series, want := range map[string]float64{
		fmt.Sprintf(`kvindex_worker_state{state="live",worker=%q}`, worker):                      1,
		fmt.Sprintf(`kvindex_events_rejected_total{reason="malformed_batch",worker=%q}`, worker): 0,
		"kvindex_nats_connected": 1,
	} {
		if v, ok := m[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if _, ok := m[fmt.Sprintf(`kvindex_worker_lag_seconds{worker=%q}`, worker)]; !ok {
		t.Error("no kvindex_worker_lag_seconds series")
	}
	if !regexp.MustCompile(`kvindex_build_info\{goversion="go[^"]+",revision="[^"]*",version="[^"]+"\}`).MatchString(strings.Join(keys(m), "\n")) {
		t.Error("no kvindex_build_info series")
	}

	ns.Stop()
	poll(t, "readyz waiting for NATS", func() bool {
		return getJSON(t, hc, base+"/readyz", &ready) == 503 && len(ready.Waiting) == 1 && strings.HasPrefix(ready.Waiting[0], "nats (")
	})
	var health map[string]string
	if code := getJSON(t, hc, base+"/healthz", &health); code != 200 || health["nats"] != "reconnecting" {
		t.Fatalf("healthz without NATS: %d %v, want 200 reconnecting", code, health)
	}
	stop()
	if code := waitExit(t, done, "relay", &errOut); code != 0 {
		t.Fatalf("relay exit %d: %s", code, errOut.String())
	}
}

func keys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestServeNATSWorkers: `kvindex relay --ops testdata/demo.jsonl --model llama`, then
// `kvindex serve --nats --models llama=4`: /v1/workers lists every worker of the log
// (it used to list none while /v1/match answered from them) with its model, state,
// last sequence, events by kind as the reference model accepted them and its size;
// /metrics carries the stream position and lag and the workers' series.
func TestServeNATSWorkers(t *testing.T) {
	url := relayNATS(t)
	const opsPath = "../../testdata/demo.jsonl"
	if code, stdout, stderr := runCLI(t, "relay", "--nats", url, "--ops", opsPath, "--model", "llama", "--memory"); code != 0 {
		t.Fatalf("relay: exit %d\n%s%s", code, stdout, stderr)
	}
	f, err := os.Open(opsPath)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := oplog.ReadAll(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	type counts struct {
		seq, stored, removed, cleared, rejected uint64
		gone                                    bool
	}
	want := map[string]*counts{}
	m := refmodel.New()
	events := 0
	for i := range ops {
		op := &ops[i]
		if op.Kind == oplog.Query {
			continue
		}
		events++
		c := want[op.Worker]
		if c == nil {
			c = &counts{}
			want[op.Worker] = c
		}
		c.seq++
		switch err := m.Apply(op); {
		case err != nil:
			c.rejected++
		case op.Kind == oplog.Stored:
			c.stored++
		case op.Kind == oplog.Removed:
			c.removed++
		case op.Kind == oplog.Cleared:
			c.cleared++
		}
		c.gone = op.Kind == oplog.RemoveWorker
	}

	var out, errOut syncBuffer
	done, stop := background(t, func(ctx context.Context) int {
		return serveMain(ctx, []string{"--nats", url, "--models", "llama=4", "--listen", "127.0.0.1:0", "--log-level", "warn"}, &out, &errOut)
	})
	addr := waitListening(t, &out, &errOut)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	base := "http://" + addr
	var ready map[string]any
	poll(t, "serve ready", func() bool { return getJSON(t, hc, base+"/readyz", &ready) == 200 })

	var ws struct {
		Workers []server.WorkerInfo `json:"workers"`
	}
	if code := getJSON(t, hc, base+"/v1/workers", &ws); code != 200 {
		t.Fatalf("/v1/workers: %d", code)
	}
	if len(ws.Workers) != len(want) {
		t.Fatalf("%d workers listed, want %d: %+v", len(ws.Workers), len(want), ws.Workers)
	}
	removed := 0
	for _, w := range ws.Workers {
		c := want[w.Worker]
		if c == nil {
			t.Fatalf("unknown worker %+v", w)
		}
		state := "replicated"
		if c.gone { // the log ends by removing some workers
			state = "removed"
			removed++
		}
		switch {
		case w.Model != "llama" || w.State != state || !w.Synced || !w.Connected:
			t.Errorf("%s: model %q state %q synced %v connected %v, want llama %s", w.Worker, w.Model, w.State, w.Synced, w.Connected, state)
		case w.LastSeq == nil || *w.LastSeq != c.seq:
			t.Errorf("%s: last_seq %v, want %d", w.Worker, w.LastSeq, c.seq)
		case w.Events.Stored != c.stored || w.Events.Removed != c.removed || w.Events.Cleared != c.cleared || w.Rejected["index"] != c.rejected:
			t.Errorf("%s: events %+v rejected %v, want %+v", w.Worker, w.Events, w.Rejected, *c)
		case w.Size == nil || *w.Size != size(m, w.Worker):
			t.Errorf("%s: size %v, want %d", w.Worker, w.Size, size(m, w.Worker))
		case w.IdleSeconds == nil || w.LagSeconds < 0:
			t.Errorf("%s: idle %v lag %v", w.Worker, w.IdleSeconds, w.LagSeconds)
		}
	}
	if removed == 0 || removed == len(want) {
		t.Fatalf("%d of %d workers removed: the log no longer covers both states", removed, len(want))
	}
	met := scrape(t, hc, base+"/metrics")
	for series, v := range map[string]float64{
		"kvindex_stream_last_applied_sequence":              float64(events),
		"kvindex_stream_start_sequence":                     float64(events),
		"kvindex_stream_pending_messages":                   0,
		`kvindex_stream_messages_total{result="duplicate"}`: 0,
		"kvindex_nats_connected":                            1,
	} {
		if got, ok := met[series]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	if a, r := met[`kvindex_stream_messages_total{result="applied"}`], met[`kvindex_stream_messages_total{result="rejected"}`]; a+r != float64(events) {
		t.Errorf("stream messages applied %v + rejected %v, want %d", a, r, events)
	}
	for w, c := range want {
		if got := met[fmt.Sprintf(`kvindex_worker_last_seq{worker=%q}`, w)]; got != float64(c.seq) {
			t.Errorf("kvindex_worker_last_seq{worker=%q} = %v, want %d", w, got, c.seq)
		}
		state := "replicated"
		if c.gone {
			state = "removed"
		}
		if got := met[fmt.Sprintf(`kvindex_worker_state{state=%q,worker=%q}`, state, w)]; got != 1 {
			t.Errorf("%s not %s in /metrics", w, state)
		}
	}
	stop()
	if code := waitExit(t, done, "serve", &errOut); code != 0 {
		t.Fatalf("serve exit %d: %s", code, errOut.String())
	}
}

func size(m *refmodel.Model, worker string) int {
	n, _ := m.Size(worker)
	return n
}
