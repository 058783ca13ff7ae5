package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/server"
)

const otherToken = "another-bearer-token-of-some-length"

// call sends an authenticated request and decodes its answer into out.
func (g *guarded) call(t *testing.T, token, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest("POST", g.http+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// TestTrackingPerClient (issue 33, row 4): one client could hold every tracking slot
// (1,048,576 unfinished request ids), finish any other client's requests by their
// ids, and starve a worker of every cost pick with one /v1/routed of 65,535 hashes.
// Now a client's tracked requests are bounded (routing.max_client_in_flight, and
// max_client_worker_blocks per worker), ids are the client's own (another's finish
// finds nothing; the same id is no collision), and the other client keeps being
// served, its picks spread over every worker.
func TestTrackingPerClient(t *testing.T) {
	g := startGuarded(t, server.Config{
		Auth:    server.AuthConfig{TokenFile: writeTokens(t, testToken, otherToken)},
		Engines: []server.EngineConfig{{Worker: "a", Model: "m", BlockSize: 4}, {Worker: "b", Model: "m", BlockSize: 4}, {Worker: "c", Model: "m", BlockSize: 4}},
		Routing: server.RoutingConfig{MaxClientInFlight: 8},
	})
	// The attacker: tracked requests past its bound are refused.
	refused := 0
	for i := range 20 {
		body := fmt.Sprintf(`{"model":"m","worker":"b","tokens":[%d,1,2,3],"request_id":"r%d"}`, i, i)
		switch code := g.call(t, otherToken, "/v1/routed", body, nil); code {
		case 200:
		case 429:
			refused++
		default:
			t.Fatalf("routed %d: %d", i, code)
		}
	}
	if refused != 12 {
		t.Fatalf("%d of 20 tracked requests refused, want 12 (max_client_in_flight 8)", refused)
	}
	// One /v1/routed of 65,535 hashes is past max_client_worker_blocks (16,384).
	hashes := strings.TrimSuffix(strings.Repeat("7,", 65535), ",")
	if code := g.call(t, otherToken, "/v1/finished", `{"request_id":"r0"}`, nil); code != 200 {
		t.Fatalf("finish: %d", code)
	}
	if code := g.call(t, otherToken, "/v1/routed", `{"model":"m","worker":"a","content_hashes":[`+hashes+`],"request_id":"big"}`, nil); code != 429 {
		t.Fatalf("a routed request of 65,535 blocks: %d, want 429", code)
	}
	// The served client: its picks are served, under ids the attacker also uses.
	var f server.FinishedResponse
	for _, id := range []string{"r1", "v"} {
		var resp server.MatchResponse
		body := fmt.Sprintf(`{"model":"m","tokens":[9,9,9,9],"policy":"cost","pick":true,"request_id":%q}`, id)
		if code := g.call(t, testToken, "/v1/match", body, &resp); code != 200 || resp.Pick == nil || resp.Pick.RequestID != id {
			t.Fatalf("pick %s during the attack: %d %+v", id, code, resp.Pick)
		}
	}
	// Only the identity that created a request finishes it, over HTTP and gRPC.
	if g.call(t, otherToken, "/v1/finished", `{"request_id":"v"}`, &f); f.Known {
		t.Fatal("the attacker finished the served client's request")
	}
	md := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+otherToken)
	if r, err := g.grpc.Finished(md, &kvindexv1.FinishedRequest{RequestId: "v"}); err != nil || r.Known {
		t.Fatalf("the attacker finished the served client's request over gRPC: %v %v", r, err)
	}
	for _, id := range []string{"r1", "v"} {
		if g.call(t, testToken, "/v1/finished", fmt.Sprintf(`{"request_id":%q}`, id), &f); !f.Known {
			t.Fatalf("the served client could not finish its request %s", id)
		}
	}
	if g.call(t, otherToken, "/v1/finished", `{"request_id":"r1"}`, &f); !f.Known {
		t.Fatal("the attacker's own r1 was finished by the other client")
	}
	// Worker a is not starved: three identical cost picks land on a, b and c... once
	// the attacker's load on b is gone.
	for i := 2; i < 8; i++ {
		g.call(t, otherToken, "/v1/finished", fmt.Sprintf(`{"request_id":"r%d"}`, i), nil)
	}
	seen := map[string]bool{}
	for i := range 3 {
		var resp server.MatchResponse
		body := fmt.Sprintf(`{"model":"m","tokens":[5,5,5,5],"policy":"cost","pick":true,"request_id":"s%d"}`, i)
		if code := g.call(t, testToken, "/v1/match", body, &resp); code != 200 || resp.Pick == nil {
			t.Fatalf("pick: %d", code)
		}
		seen[resp.Pick.Worker] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three cost picks went to %v, want a, b and c", seen)
	}
}
