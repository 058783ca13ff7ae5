package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/server/internal/guard"
)

// The peer check (ReplicaOptions.Peer): anti-entropy between two replicas of one
// stream. Every PeerInterval the replica reads the peer's /v1/workers and compares, for
// each worker both have applied up to the same worker sequence (last_seq), its digest
// with the peer's: equal events applied, equal digests, so a difference there is not
// lag. A worker found differing at the same sequences in two checks in a row (one check
// reads the two sides a moment apart) is counted in
// kvindex_replica_peer_mismatches_total and, with PeerResync, rebuilt from the stream
// (fabric.Replica.Resync; kvindex_replica_resyncs_total). Either side may be the wrong
// one: the stream decides, so two replicas checking each other both resync the worker
// and agree afterwards.
//
// The peer is another process: its answer is bounded (ReplicaOptions.PeerMaxBytes,
// default 8 MiB, and at most maxPeerWorkers workers), and decoded into the four fields
// the check reads, so that a hostile or broken peer costs a bounded few MiB (before, a
// 10 MB answer of empty objects grew the replica to 3.4 GB). Under authentication the
// check sends a bearer token (PeerTokenFile) and trusts a CA (PeerCAFile).

// Defaults and bounds of the peer check.
const (
	defaultPeerInterval = 30 * time.Second
	defaultPeerMaxBytes = 8 << 20
	maxPeerWorkers      = 1 << 16
)

// peerCheck is the replica's comparison with its peer.
type peerCheck struct {
	url      string
	maxBytes int64
	every    time.Duration
	resync   bool
	hc       *http.Client
	suspects map[string]uint64 // worker -> the sequence it differed at in the last check

	checks     *prometheus.CounterVec // by result: agree, differ, error
	mismatches prometheus.Counter
	resyncs    *prometheus.CounterVec // by result: ok, error
}

func newPeerCheck(o ReplicaOptions) (*peerCheck, error) {
	p := &peerCheck{url: strings.TrimSuffix(o.Peer, "/"), every: o.PeerInterval, resync: o.PeerResync, hc: o.PeerClient,
		maxBytes: cmp.Or(o.PeerMaxBytes, defaultPeerMaxBytes),
		suspects: map[string]uint64{},
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_replica_peer_checks_total",
			Help: "Comparisons of the replica's worker digests with its peer's (--peer), by result: agree, differ (some worker differed at equal sequences), error (the peer did not answer)."}, []string{"result"}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_replica_peer_mismatches_total",
			Help: "Workers whose digest differed from the peer's at equal worker sequences in two checks in a row."}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_replica_resyncs_total",
			Help: "Workers rebuilt from the stream after a peer mismatch (--peer-resync), by result: ok, error."}, []string{"result"}),
	}
	if p.every <= 0 {
		p.every = defaultPeerInterval
	}
	if p.hc == nil {
		hc, err := peerClient(o.PeerTokenFile, o.PeerCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: the peer check: %w", ErrConfig, err)
		}
		p.hc = hc
	}
	return p, nil
}

// peerClient is the peer check's HTTP client: it trusts caFile's CAs and sends
// tokenFile's first token.
func peerClient(tokenFile, caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	if tokenFile != "" {
		tok, err := guard.FirstToken(tokenFile)
		if err != nil {
			return nil, err
		}
		hc.Transport = bearer{tr, "Bearer " + tok}
	}
	return hc, nil
}

// bearer adds a bearer token to every request.
type bearer struct {
	rt   http.RoundTripper
	cred string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.cred)
	return b.rt.RoundTrip(r)
}

func (p *peerCheck) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.checks, p.mismatches, p.resyncs}
}

// run checks every interval until ctx ends.
func (p *peerCheck) run(ctx context.Context, s *Server) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.check(ctx, s)
		}
	}
}

// check compares once and resyncs the confirmed mismatches.
func (p *peerCheck) check(ctx context.Context, s *Server) {
	theirs, err := p.fetch(ctx)
	if err != nil {
		p.checks.WithLabelValues("error").Inc()
		s.log.Warn("peer check: the peer did not answer", "peer", p.url, "err", err)
		return
	}
	ours := map[string]uint64{}
	for _, wi := range s.feed.workers() {
		if wi.LastSeq != nil && wi.Synced {
			ours[wi.Worker] = *wi.LastSeq
		}
	}
	digests := s.eng.Digests()
	suspects := map[string]uint64{}
	var confirmed []string
	for _, wi := range theirs {
		seq, ok := ours[wi.Worker]
		if !ok || wi.LastSeq == nil || *wi.LastSeq != seq || !wi.Synced || wi.Digest == nil {
			continue // not at the same point of the worker's stream: lag, not a difference
		}
		sum, err := ParseDigest(wi.Digest.Sum)
		if err != nil {
			continue
		}
		mine := digests[wi.Worker]
		if sum == mine.Sum && wi.Digest.Blocks == mine.Blocks {
			continue
		}
		suspects[wi.Worker] = seq
		if prev, ok := p.suspects[wi.Worker]; ok && prev == seq {
			confirmed = append(confirmed, wi.Worker)
		}
	}
	p.suspects = suspects
	if len(suspects) == 0 {
		p.checks.WithLabelValues("agree").Inc()
		return
	}
	p.checks.WithLabelValues("differ").Inc()
	for _, w := range confirmed {
		p.mismatches.Inc()
		s.log.Warn("peer check: the worker's digest differs from the peer's at the same sequence", "worker", w, "peer", p.url, "resync", p.resync)
		if !p.resync {
			continue
		}
		if _, err := s.feed.rep.Resync(ctx, w); err != nil {
			p.resyncs.WithLabelValues("error").Inc()
			s.log.Warn("peer check: resync failed", "worker", w, "err", err)
			continue
		}
		p.resyncs.WithLabelValues("ok").Inc()
		delete(p.suspects, w)
	}
}

// peerWorker is what the check reads of a peer's worker.
type peerWorker struct {
	Worker  string  `json:"worker"`
	LastSeq *uint64 `json:"last_seq"`
	Synced  bool    `json:"synced"`
	Digest  *struct {
		Sum    string `json:"sum"`
		Blocks int    `json:"blocks"`
	} `json:"digest"`
}

// fetch reads the peer's /v1/workers: at most maxBytes of it, at most maxPeerWorkers
// workers, decoded one at a time.
func (p *peerCheck) fetch(ctx context.Context) ([]peerWorker, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/v1/workers", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	dec := json.NewDecoder(&capped{r: resp.Body, left: p.maxBytes})
	want := func(d json.Delim) error {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if t != d {
			return fmt.Errorf("want %v, got %v", d, t)
		}
		return nil
	}
	if err := want('{'); err != nil {
		return nil, err
	}
	var out []peerWorker
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if key != "workers" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
			continue
		}
		if err := want('['); err != nil {
			return nil, err
		}
		for dec.More() {
			if len(out) == maxPeerWorkers {
				return nil, fmt.Errorf("the peer lists more than %d workers", maxPeerWorkers)
			}
			out = append(out, peerWorker{})
			if err := dec.Decode(&out[len(out)-1]); err != nil {
				return nil, err
			}
		}
		if err := want(']'); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// capped reads r and fails once more than left bytes came.
type capped struct {
	r    io.Reader
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errPeerTooLong
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if c.left -= int64(n); c.left < 0 {
		return 0, errPeerTooLong
	}
	return n, err
}

var errPeerTooLong = errors.New("the peer's answer is longer than ReplicaOptions.PeerMaxBytes")
