package fleet

import (
	"bufio"
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Serve's own latency histograms, read from its /metrics at a level's start and end:
// the difference is the level's. They tell where a query waits: httpMatchHist and
// grpcMatchHist are serve's time in its match handlers (the HTTP one from the request
// to the response written, the gRPC one from the decoded request to the answer),
// schedHist the Go scheduler's runnable-to-running wait of every goroutine
// (runtime/metrics /sched/latencies: queries waiting behind ingestion for a P show
// here), findHist the index's find-matches call of /v1/match. A client's match latency
// past serve's is the network, the transport's framing, and the OS not running either
// side (the clients run in the load generator, 10 nicer than serve).
const (
	schedHist     = "go_sched_latencies_seconds"
	findHist      = "kvindex_find_matches_duration_seconds"
	httpMatchHist = `kvindex_http_request_duration_seconds{handler="match"}`
	grpcMatchHist = `kvindex_grpc_request_duration_seconds{method="/kvindex.v1.Index/Match"}`
)

// serveHists are the histograms a level reads.
var serveHists = []string{schedHist, findHist, httpMatchHist, grpcMatchHist}

// hist is a cumulative Prometheus histogram: counts[i] observations at most le[i].
type hist struct {
	le     []float64
	counts []float64
}

// scrapeHists reads the named histograms from serve's /metrics.
func scrapeHists(ctx context.Context, hc *http.Client, addr string, names ...string) (map[string]*hist, error) {
	body, err := get(ctx, hc, addr, "/metrics")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	out := map[string]*hist{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for _, n := range names {
			if le, v, ok := parseBucket(sc.Text(), n); ok {
				if out[n] == nil {
					out[n] = &hist{}
				}
				out[n].le = append(out[n].le, le)
				out[n].counts = append(out[n].counts, v)
			}
		}
	}
	return out, sc.Err()
}

// parseBucket parses `NAME_bucket{le="X"} V`, or for a name given with labels,
// NAME{LABELS}, `NAME_bucket{LABELS,le="X"} V` (the text format puts le last: labels
// are sorted, and le sorts after the ones serve uses).
func parseBucket(line, name string) (le, v float64, ok bool) {
	prefix := name + `_bucket{le="`
	if base, labels, has := strings.Cut(name, "{"); has {
		prefix = base + "_bucket{" + strings.TrimSuffix(labels, "}") + `,le="`
	}
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return 0, 0, false
	}
	leStr, rest, ok := strings.Cut(rest, `"} `)
	if !ok {
		return 0, 0, false
	}
	le, err1 := strconv.ParseFloat(leStr, 64) // "+Inf" parses as +Inf
	v, err2 := strconv.ParseFloat(strings.TrimSpace(rest), 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return le, v, true
}

// quantileSince is the q-quantile of the observations in h after those in from, as
// the upper bound of the bucket it falls in (0 with none, or buckets that differ).
func (h *hist) quantileSince(from *hist, q float64) time.Duration {
	if h == nil || from == nil || len(h.le) != len(from.le) || len(h.le) == 0 {
		return 0
	}
	total := h.counts[len(h.counts)-1] - from.counts[len(from.counts)-1]
	if total <= 0 {
		return 0
	}
	for i := range h.le {
		if h.counts[i]-from.counts[i] >= q*total {
			if math.IsInf(h.le[i], 1) {
				return time.Duration(math.MaxInt64)
			}
			return time.Duration(h.le[i] * float64(time.Second))
		}
	}
	return 0
}
