package server_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/freeport"
	"github.com/kvindex/kvindex/server"
)

const adminToken = "an-admin-token-of-some-length"

// as sends a request with a bearer token and returns the status and error code.
func (g *guarded) as(t *testing.T, token, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, g.http+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Code string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Code
}

// TestAdminRole (issue 33, row 6): the query token was also the admin token: any
// client could add engines (and make serve bind or dial), register, unregister and
// resync. Now those need an admin token (auth.admin_token_file), and without one
// configured nobody may use them while clients are authenticated.
func TestAdminRole(t *testing.T) {
	g := startGuarded(t, server.Config{Auth: server.AuthConfig{AdminTokenFile: writeTokens(t, adminToken)}})
	engine := fmt.Sprintf(`{"endpoint":"tcp://%s","worker":"w","model":"m","block_size":4}`, freeport.Addr(t))
	for _, c := range []struct {
		token, method, path, body string
		want                      int
	}{
		{testToken, "GET", "/v1/engines", "", 403},
		{testToken, "POST", "/v1/engines", engine, 403},
		{testToken, "DELETE", "/v1/engines/x", "", 403},
		{testToken, "POST", "/register", `{}`, 403},
		{testToken, "POST", "/unregister", `{}`, 403},
		{testToken, "POST", "/v1/workers/w/resync", "", 403},
		{testToken, "POST", "/v1/match", `{"model":"m","content_hashes":[1]}`, 200},
		{adminToken, "POST", "/v1/engines", engine, 201},
		{adminToken, "GET", "/v1/engines", "", 200},
		{adminToken, "POST", "/v1/match", `{"model":"m","content_hashes":[1]}`, 200},
		{"wrong-token-of-some-length", "GET", "/v1/engines", "", 401},
	} {
		if got, code := g.as(t, c.token, c.method, c.path, c.body); got != c.want {
			t.Errorf("%s %s as %.5s: %d (%s), want %d", c.method, c.path, c.token, got, code, c.want)
		}
	}
	// Without an admin token configured, the admin endpoints are closed to everyone.
	g2 := startGuarded(t, server.Config{})
	if got, code := g2.as(t, testToken, "POST", "/v1/engines", engine); got != 403 || code != "forbidden" {
		t.Fatalf("the engines API with no admin token configured: %d %s", got, code)
	}
}

// TestRuntimeEngineRefusals (issue 33, rows 5-7): through the engines API a client made
// serve listen on every interface with no allowed_peers, create a socket file anywhere
// it could write, dial any host, and hold 1 MB model names (/metrics 300 MB, RSS 675 MB
// for 100 of them). Now each is refused with 400 before anything is planned.
func TestRuntimeEngineRefusals(t *testing.T) {
	dir := t.TempDir()
	_, c := start(t, server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4},
		RuntimeEngines: server.RuntimeEnginesConfig{MaxEngines: 3, IPCDir: dir, DialAllow: []string{"127.0.0.0/8", "engine-a"}}})
	c.waitReady(t)
	port := func() string {
		_, p, _ := net.SplitHostPort(freeport.Addr(t))
		return p
	}
	for _, e := range []struct {
		spec string
		want int
	}{
		{fmt.Sprintf(`{"endpoint":"tcp://0.0.0.0:%s","bind":true,"worker":"a","model":"m","block_size":4}`, port()), 400},
		{fmt.Sprintf(`{"endpoint":"tcp://*:%s","bind":true,"worker":"a","model":"m","block_size":4,"allowed_peers":["10.0.0.1"]}`, port()), 400}, // allow_bind off
		{`{"endpoint":"ipc:///tmp/kvindex-hostile.sock","bind":true,"worker":"a","model":"m","block_size":4}`, 400},
		{fmt.Sprintf(`{"endpoint":"ipc://%s/../x.sock","worker":"a","model":"m","block_size":4}`, dir), 400},
		{fmt.Sprintf(`{"endpoint":"tcp://10.9.8.7:%s","worker":"a","model":"m","block_size":4}`, port()), 400}, // not in dial_allow
		{fmt.Sprintf(`{"endpoint":"tcp://engine-b:%s","worker":"a","model":"m","block_size":4}`, port()), 400}, // not in dial_allow
		{fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%s","worker":"a","model":"m","block_size":4,"replay_endpoint":"tcp://10.9.8.7:1"}`, port()), 400},
		{fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%s","worker":"a","model":%q}`, port(), strings.Repeat("m", 1<<19)), 400},
		{fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%s","worker":%q,"model":"m","block_size":4}`, port(), strings.Repeat("w", 300)), 400},
		{fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%s","bind":true,"worker":"a","model":"m","block_size":4}`, port()), 201},
		{fmt.Sprintf(`{"endpoint":"ipc://%s/b.sock","worker":"b","model":"m","block_size":4}`, filepath.Clean(dir)), 201},
		{fmt.Sprintf(`{"endpoint":"tcp://engine-a:%s","worker":"c","model":"m","block_size":4}`, port()), 201},
		{fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%s","worker":"d","model":"m","block_size":4}`, port()), 400}, // past max_engines
	} {
		var out struct{ Code, Error string }
		if got := c.do("POST", "/v1/engines", e.spec, &out); got != e.want {
			t.Errorf("%.120s: %d %+v, want %d", e.spec, got, out, e.want)
		}
	}
	if got := metric(c, `kvindex_engines{source="api"}`); got != 3 {
		t.Fatalf("%v engines from the API, want 3", got)
	}
}

// TestServerRequestIDsUnguessable (issue 33, row 4): the ids the server gave picks the
// caller did not name were sequential (kvindex-1, kvindex-2, ...), so any client could
// finish another's picks. They are 128 random bits now.
func TestServerRequestIDsUnguessable(t *testing.T) {
	_, c := start(t, server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Worker: "w", Model: "m", BlockSize: 4}}})
	c.waitReady(t)
	seen := map[string]bool{}
	for range 3 {
		var got server.MatchResponse
		if code := c.do("POST", "/v1/match", `{"model":"m","content_hashes":[1],"pick":true}`, &got); code != 200 || got.Pick == nil {
			t.Fatalf("pick: %d %+v", code, got)
		}
		id := got.Pick.RequestID
		if len(id) != len("kvindex-")+32 || seen[id] || !strings.HasPrefix(id, "kvindex-") {
			t.Fatalf("a server-made request id %q (seen %v)", id, seen)
		}
		seen[id] = true
	}
	var f server.FinishedResponse
	if code := c.do("POST", "/v1/finished", `{"request_id":"kvindex-1"}`, &f); code != 200 || f.Known {
		t.Fatalf("a guessed id: %d %+v", code, f)
	}
}
