package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/fabric"
)

// Replica digests (engine.Digest): each /v1/workers entry and gRPC Worker carries the
// order-independent digest of what the index holds for the worker, over all of it and
// per namespace, so that two replicas, or a replica and a snapshot, can tell which
// workers they disagree on (kvindex doctor --compare). /metrics has
// kvindex_worker_digest{worker}: the digest's top 52 bits, which a float64 holds
// exactly, so that a query can compare replicas (max by (worker) != min by (worker)).

// DigestInfo is a digest as /v1/workers reports it: Sum in 16 hex digits (a JSON number
// would lose its low bits in most clients).
type DigestInfo struct {
	Sum    string `json:"sum"`
	Blocks int    `json:"blocks"`
	// Namespaces has one digest per namespace the worker holds blocks in ("" is the
	// default namespace); omitted in a namespace's own entry.
	Namespaces map[string]DigestInfo `json:"namespaces,omitempty"`
}

// FormatDigest is a digest sum as DigestInfo.Sum writes it.
func FormatDigest(sum uint64) string { return fmt.Sprintf("%016x", sum) }

// ParseDigest reads DigestInfo.Sum.
func ParseDigest(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("server: digest %q: want 16 hex digits", s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("server: digest %q: %w", s, err)
	}
	return v, nil
}

// NewDigestInfo is d as /v1/workers reports it.
func NewDigestInfo(d engine.WorkerDigest) *DigestInfo {
	out := &DigestInfo{Sum: FormatDigest(d.Sum), Blocks: d.Blocks}
	if len(d.Namespaces) > 0 {
		out.Namespaces = make(map[string]DigestInfo, len(d.Namespaces))
		for ns, nd := range d.Namespaces {
			out.Namespaces[ns] = DigestInfo{Sum: FormatDigest(nd.Sum), Blocks: nd.Blocks}
		}
	}
	return out
}

// WorkerDigest reads a DigestInfo back into an engine.WorkerDigest (a nil one: the
// empty digest).
func (d *DigestInfo) WorkerDigest() (engine.WorkerDigest, error) {
	out := engine.WorkerDigest{Namespaces: map[string]engine.Digest{}}
	if d == nil {
		return out, nil
	}
	sum, err := ParseDigest(d.Sum)
	if err != nil {
		return out, err
	}
	out.Sum, out.Blocks = sum, d.Blocks
	for ns, nd := range d.Namespaces {
		s, err := ParseDigest(nd.Sum)
		if err != nil {
			return out, err
		}
		out.Namespaces[ns] = engine.Digest{Sum: s, Blocks: nd.Blocks}
	}
	return out, nil
}

// digestsOf is the index's digests, or nil without one.
func (s *Server) digestsOf() map[string]engine.WorkerDigest {
	if s.eng == nil {
		return nil
	}
	return s.eng.Digests()
}

// withDigests fills each entry's Digest from ds (a worker the index does not know has
// the empty digest).
func withDigests(infos []WorkerInfo, ds map[string]engine.WorkerDigest) {
	if ds == nil {
		return
	}
	for i := range infos {
		infos[i].Digest = NewDigestInfo(ds[infos[i].Worker])
	}
}

// digestCollector exports kvindex_worker_digest{worker}.
type digestCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newDigestCollector(s *Server) *digestCollector {
	return &digestCollector{s: s, desc: prometheus.NewDesc("kvindex_worker_digest",
		"The top 52 bits of the order-independent digest of what the index holds for the worker (exact in a float64; the full digest is in /v1/workers): replicas that agree on a worker report the same value.",
		[]string{"worker"}, nil)}
}

func (c *digestCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *digestCollector) Collect(ch chan<- prometheus.Metric) {
	ds := c.s.digestsOf()
	for _, w := range slices.Sorted(maps.Keys(ds)) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(ds[w].Sum>>12), w)
	}
}

// ResyncInfo is the answer of POST /v1/workers/{worker}/resync.
type ResyncInfo struct {
	Worker string `json:"worker"`
	// Messages and Applied count the worker's stream messages the replay read and
	// applied (fabric.ResyncResult). A stream whose retention dropped its first
	// messages is refused (503 resync_failed), the worker untouched.
	Messages uint64      `json:"messages"`
	Applied  uint64      `json:"applied"`
	Complete bool        `json:"complete"`
	Digest   *DigestInfo `json:"digest"`
}

// resyncTimeout bounds one resync's replay.
const resyncTimeout = 2 * time.Minute

// handleResync rebuilds one worker of a NATS replica from its stream
// (fabric.Replica.Resync): what kvindex doctor --compare --resync asks of the replica
// whose digest differs. A server that follows its engines over ZeroMQ answers 501: its
// subscribers rebuild a stale worker from the engine's replay themselves.
func (s *Server) handleResync(w http.ResponseWriter, r *http.Request) {
	worker := r.PathValue("worker")
	if worker == "" {
		writeError(w, http.StatusBadRequest, "bad_request", "no worker in the path")
		return
	}
	if s.feed == nil {
		writeError(w, http.StatusNotImplemented, "not_supported", "only a NATS replica (serve --nats) resyncs a worker on request")
		return
	}
	if !slices.ContainsFunc(s.feed.rep.Workers(), func(rw fabric.ReplicaWorker) bool { return rw.Worker == worker }) {
		writeError(w, http.StatusNotFound, "unknown_worker", "the replica follows no worker %.256q", worker)
		return
	}
	if wait, why := s.resyncs.admit(worker, s.now()); why != "" {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(wait.Seconds()+0.5))))
		msg := "another resync is running; one runs at a time"
		if why == "recent" {
			msg = fmt.Sprintf("worker %q was resynced less than %v ago", worker, resyncInterval)
		}
		writeError(w, http.StatusTooManyRequests, "resync_limited", "%s", msg)
		return
	}
	defer s.resyncs.done()
	ctx, cancel := context.WithTimeout(r.Context(), resyncTimeout)
	defer cancel()
	res, err := s.feed.rep.Resync(ctx, worker)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "resync_failed", "%v", err)
		return
	}
	s.log.Info("worker resynced from the stream", "worker", worker, "messages", res.Messages, "applied", res.Applied, "complete", res.Complete)
	d, _ := s.eng.Digest(worker)
	writeJSON(w, http.StatusOK, ResyncInfo{Worker: worker, Messages: res.Messages, Applied: res.Applied, Complete: res.Complete, Digest: NewDigestInfo(d)})
}
