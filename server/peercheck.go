package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/readlimit"
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

// defaultPeerInterval is ReplicaOptions.PeerInterval's default.
const defaultPeerInterval = 30 * time.Second

// peerCheck is the replica's comparison with its peer.
type peerCheck struct {
	url      string
	every    time.Duration
	resync   bool
	hc       *http.Client
	suspects map[string]uint64 // worker -> the sequence it differed at in the last check

	checks     *prometheus.CounterVec // by result: agree, differ, error
	mismatches prometheus.Counter
	resyncs    *prometheus.CounterVec // by result: ok, error
}

func newPeerCheck(o ReplicaOptions) *peerCheck {
	p := &peerCheck{url: strings.TrimSuffix(o.Peer, "/"), every: o.PeerInterval, resync: o.PeerResync, hc: o.PeerClient,
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
		p.hc = &http.Client{Timeout: 10 * time.Second}
	}
	return p
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
		d, err := wi.Digest.WorkerDigest()
		if err != nil {
			continue
		}
		mine := digests[wi.Worker]
		if d.Sum == mine.Sum && d.Blocks == mine.Blocks {
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

// fetch reads the peer's /v1/workers.
func (p *peerCheck) fetch(ctx context.Context) ([]WorkerInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/v1/workers", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := readlimit.ReadAll(resp.Body, 1<<30)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var out struct{ Workers []WorkerInfo }
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	return out.Workers, nil
}
