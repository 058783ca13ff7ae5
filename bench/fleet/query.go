package fleet

import (
	"github.com/kvindex/kvindex/internal/fakevllm"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/client"
)

// Latency summarises one series of durations.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

func summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Latency{N: len(d), P50: at(0.50), P99: at(0.99), Max: d[len(d)-1]}
}

// APIs the query clients use.
const (
	APIHTTP = "http"
	APIGRPC = "grpc"
)

// matcher answers one query: the matches' workers and scores for content.
type matcher interface {
	match(ctx context.Context, content []uint64, scores map[string]int) error
}

// httpMatcher posts /v1/match with content_hashes.
type httpMatcher struct {
	url    string
	client *http.Client
	pool   sync.Pool // *bytes.Buffer
}

func newHTTPMatcher(addr string, conns int) *httpMatcher {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute}
	return &httpMatcher{url: "http://" + addr + "/v1/match", client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

type matchAnswer struct {
	Matches []struct {
		Worker string `json:"worker"`
		Score  int    `json:"score"`
	} `json:"matches"`
}

func (m *httpMatcher) match(ctx context.Context, content []uint64, scores map[string]int) error {
	b, _ := m.pool.Get().(*bytes.Buffer)
	if b == nil {
		b = new(bytes.Buffer)
	}
	defer m.pool.Put(b)
	b.Reset()
	buf := append(b.AvailableBuffer(), `{"model":"`+fakevllm.Model+`","content_hashes":[`...)
	for i, c := range content {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendUint(buf, c, 10)
	}
	buf = append(buf, "]}"...)
	b.Write(buf)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.url, bytes.NewReader(b.Bytes()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := m.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("/v1/match: %s: %s", resp.Status, body)
	}
	if scores == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	var a matchAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return err
	}
	for _, mt := range a.Matches {
		scores[mt.Worker] = mt.Score
	}
	return nil
}

// grpcMatcher calls Index.Match.
type grpcMatcher struct{ c *client.Client }

func (m grpcMatcher) match(ctx context.Context, content []uint64, scores map[string]int) error {
	resp, err := m.c.Match(ctx, &kvindexv1.MatchRequest{Model: fakevllm.Model, ContentHashes: content})
	if err != nil {
		return err
	}
	if scores != nil {
		for _, mt := range resp.GetMatches() {
			scores[mt.GetWorker()] = int(mt.GetScore())
		}
	}
	return nil
}

// queryLoad drives match queries open-loop: rate queries/s spread over apis in turn,
// each timed from its scheduled start (so a queue behind a slow server counts), by at
// most conc clients at once. Each is also timed from the moment its client sent it
// (sent): the difference is the load generator's own lateness (its timer and its
// goroutines waiting for a core, run nicer than serve) and the wait for a free client.
type queryLoad struct {
	prompts  promptSource
	apis     []string
	matchers map[string]matcher
	rate     float64
	conc     int

	mu      sync.Mutex
	lat     map[string][]time.Duration
	sent    map[string][]time.Duration // the same queries, timed from their send
	errs    map[string]int
	lastErr error
	skipped atomic.Int64 // scheduled queries dropped: every client busy and the queue full
}

// promptSource gives the request chains to query: the fleet's recent ones
// (fakevllm.Fleet), or in the query child the pool the generator sent it.
type promptSource interface {
	SamplePrompt(rng *rand.Rand, dst []uint64) ([]uint64, bool)
}

func newQueryLoad(prompts promptSource, apis []string, matchers map[string]matcher, rate float64, conc int) *queryLoad {
	return &queryLoad{prompts: prompts, apis: apis, matchers: matchers, rate: rate, conc: conc,
		lat: map[string][]time.Duration{}, sent: map[string][]time.Duration{}, errs: map[string]int{}}
}

type ticket struct {
	api string
	at  time.Time
}

// maxSamples bounds the latencies kept per API and level.
const maxSamples = 1 << 20

func (q *queryLoad) run(ctx context.Context, seed uint64) {
	if q.rate <= 0 || len(q.apis) == 0 {
		return
	}
	tickets := make(chan ticket, 4*q.conc)
	var wg sync.WaitGroup
	for i := range q.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			var content []uint64
			for t := range tickets {
				var ok bool
				content, ok = q.prompts.SamplePrompt(rng, content)
				if !ok {
					continue
				}
				sent := time.Now()
				err := q.matchers[t.api].match(ctx, content, nil)
				end := time.Now()
				d := end.Sub(t.at)
				q.mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						q.errs[t.api]++
						q.lastErr = err
					}
				} else if len(q.lat[t.api]) < maxSamples {
					q.lat[t.api] = append(q.lat[t.api], d)
					q.sent[t.api] = append(q.sent[t.api], end.Sub(sent))
				}
				q.mu.Unlock()
			}
		}()
	}
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	sent := uint64(0)
	for ctx.Err() == nil {
		// Ticket k is due at k/rate: every ticket due by now goes out.
		due := uint64(time.Since(start).Seconds()*q.rate) + 1
		for ; sent < due; sent++ {
			at := start.Add(time.Duration(float64(sent) / q.rate * 1e9))
			select {
			case tickets <- ticket{api: q.apis[sent%uint64(len(q.apis))], at: at}:
			default:
				q.skipped.Add(1)
			}
		}
		wait := time.Duration(float64(sent)/q.rate*1e9) - time.Since(start)
		timer.Reset(max(wait, 200*time.Microsecond))
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	timer.Stop()
	close(tickets)
	wg.Wait()
}

// prober times apply lag: every 1/rate seconds it asks the fleet for the next batch
// published, then polls /v1/match with that batch's request chain until the engine's
// worker matches all of it: every poll interval at first, then every tenth of the time
// waited. The lag is the first answer that shows it minus the batch's publish time (so
// it is at most one poll interval, or 10%, and one query late).
type prober struct {
	f       *fakevllm.Fleet
	m       matcher
	rate    float64
	poll    time.Duration
	timeout time.Duration

	mu      sync.Mutex
	lags    []time.Duration
	expired int // probes not visible within timeout
	errs    int
	lastErr error
}

func (p *prober) run(ctx context.Context) {
	if p.rate <= 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Duration(float64(time.Second) / p.rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.f.WantProbe(false)
			return
		case <-tick.C:
			p.f.WantProbe(true)
		case pr := <-p.f.Probes():
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.follow(ctx, pr)
			}()
		}
	}
}

func (p *prober) follow(ctx context.Context, pr fakevllm.Probe) {
	scores := map[string]int{}
	deadline := pr.At.Add(p.timeout)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		clear(scores)
		err := p.m.match(ctx, pr.Content, scores)
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.errs++
			p.lastErr = err
			p.mu.Unlock()
		} else if scores[pr.Worker] >= len(pr.Content) {
			p.mu.Lock()
			if len(p.lags) < maxSamples {
				p.lags = append(p.lags, now.Sub(pr.At))
			}
			p.mu.Unlock()
			return
		}
		if now.After(deadline) {
			p.mu.Lock()
			p.expired++
			p.mu.Unlock()
			return
		}
		// Poll every p.poll at first, then every tenth of the time waited so far: the
		// lag is known to 10%, and a probe of a backlogged server costs it a few dozen
		// queries, not one per millisecond.
		t.Reset(max(p.poll, now.Sub(pr.At)/10))
	}
}
