package server_test

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/natstest"
	"github.com/kvindex/kvindex/server"
)

// startNATS runs a NATS server on 127.0.0.1 (a nats-server process, stopped at
// cleanup) and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	return natstest.Start(t, natstest.Options{}).URL()
}

// TestLoadSharedAcrossReplicas: two serve replicas of one fleet on one NATS server.
// Three identical requests picked with dynamo-cost through alternating replicas land on
// three workers, because each replica counts the requests the other routed; their
// finishes take the load back out of both.
func TestLoadSharedAcrossReplicas(t *testing.T) {
	url := startNATS(t)
	a, ca := startWith(t, threeApproximate(), server.Options{LoadShare: &server.LoadShareOptions{URL: url, Replica: "a"}})
	b, cb := startWith(t, threeApproximate(), server.Options{LoadShare: &server.LoadShareOptions{URL: url, Replica: "b"}})
	folded := func(s *server.Server, n int) func() bool {
		return func() bool { st, ok := s.LoadShareStats(); return ok && st.InFlight == n }
	}
	body := `{"model":"m","tokens":[1,2,3,4,5,6,7,8],"policy":"dynamo-cost","pick":true}`
	seen := map[string]bool{}
	var ids []string
	pick := func(c *client) {
		t.Helper()
		var resp server.MatchResponse
		if code := c.do("POST", "/v1/match", body, &resp); code != 200 || resp.Pick == nil {
			t.Fatalf("match: %d %+v", code, resp)
		}
		seen[resp.Pick.Worker] = true
		ids = append(ids, resp.Pick.RequestID)
	}
	pick(ca)
	waitFor(t, "b folds a's pick", folded(b, 1))
	pick(cb)
	waitFor(t, "a folds b's pick", folded(a, 1))
	pick(ca)
	if len(seen) != 3 {
		t.Fatalf("three identical requests through two replicas went to %v, want three workers", seen)
	}
	waitFor(t, "b folds a's second pick", folded(b, 2))
	for i, id := range ids {
		c := ca
		if i == 1 {
			c = cb
		}
		var fr server.FinishedResponse
		if code := c.do("POST", "/v1/finished", fmt.Sprintf(`{"request_id":%q}`, id), &fr); code != 200 || !fr.Known {
			t.Fatalf("finished %s: %d %+v", id, code, fr)
		}
	}
	waitFor(t, "a folds b's finish", folded(a, 0))
	waitFor(t, "b folds a's finishes", folded(b, 0))
	if alone, _ := start(t, threeApproximate()); func() bool { _, ok := alone.LoadShareStats(); return ok }() {
		t.Fatal("a server without load sharing reports stats")
	}
}
