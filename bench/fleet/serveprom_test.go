package fleet

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestServeHists: the histograms are parsed from the text format and a level's p99 is
// taken from the difference of two scrapes, as the upper bound of its bucket.
func TestServeHists(t *testing.T) {
	scrape := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		scrape++
		// Before: 100 observations at most 1 ms. After: 100 more, 98 at most 1 ms,
		// 1 at most 4 ms, 1 past it.
		b1, b2, inf := 100, 100, 100
		if scrape > 1 {
			b1, b2, inf = 198, 199, 200
		}
		fmt.Fprintf(w, "# HELP go_sched_latencies_seconds x\n# TYPE go_sched_latencies_seconds histogram\n")
		fmt.Fprintf(w, "go_sched_latencies_seconds_bucket{le=\"0.001\"} %d\ngo_sched_latencies_seconds_bucket{le=\"0.004\"} %d\ngo_sched_latencies_seconds_bucket{le=\"+Inf\"} %d\n", b1, b2, inf)
		fmt.Fprintf(w, "go_sched_latencies_seconds_sum 1\ngo_sched_latencies_seconds_count %d\nother_bucket{le=\"1\"} 5\n", inf)
		// A labelled histogram: only the match handler's series is read.
		fmt.Fprintf(w, "kvindex_http_request_duration_seconds_bucket{handler=\"match\",le=\"0.0046\"} %d\n", b1)
		fmt.Fprintf(w, "kvindex_http_request_duration_seconds_bucket{handler=\"match\",le=\"+Inf\"} %d\n", inf)
		fmt.Fprintf(w, "kvindex_http_request_duration_seconds_bucket{handler=\"route\",le=\"0.0046\"} 0\n")
		fmt.Fprintf(w, "kvindex_http_request_duration_seconds_bucket{handler=\"route\",le=\"+Inf\"} 500\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	h0, err := scrapeHists(context.Background(), srv.Client(), addr, serveHists...)
	if err != nil {
		t.Fatal(err)
	}
	h1, err := scrapeHists(context.Background(), srv.Client(), addr, serveHists...)
	if err != nil {
		t.Fatal(err)
	}
	if got := h1[schedHist].quantileSince(h0[schedHist], 0.98); got != time.Millisecond {
		t.Errorf("p98 %v, want 1ms", got)
	}
	if got := h1[schedHist].quantileSince(h0[schedHist], 0.99); got != 4*time.Millisecond {
		t.Errorf("p99 %v, want 4ms", got)
	}
	if got := h1[schedHist].quantileSince(h0[schedHist], 1); got != time.Duration(math.MaxInt64) {
		t.Errorf("p100 %v, want the +Inf bucket", got)
	}
	if got := h1[httpMatchHist].quantileSince(h0[httpMatchHist], 0.98); got != 4600*time.Microsecond {
		t.Errorf("labelled p98 %v, want 4.6ms (the route handler's series read too?)", got)
	}
	if got := h1[httpMatchHist].quantileSince(h0[httpMatchHist], 0.99); got != time.Duration(math.MaxInt64) {
		t.Errorf("labelled p99 %v, want the +Inf bucket", got)
	}
	if got := h1[findHist].quantileSince(h0[findHist], 0.99); got != 0 {
		t.Errorf("absent histogram: %v, want 0", got)
	}
	if got := h0[schedHist].quantileSince(h0[schedHist], 0.99); got != 0 {
		t.Errorf("no observations between: %v, want 0", got)
	}
}
