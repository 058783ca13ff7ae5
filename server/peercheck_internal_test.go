package server

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"testing"
)

// TestPeerAnswerBounded (issue 33, row 9): a --peer answering 10 MB of
// {"workers":[{},{},...]} grew the replica to 3.4 GB in 24 s. Now the answer is read
// to at most PeerMaxBytes and at most maxPeerWorkers workers, one at a time into the
// fields the check reads: the hostile answers are errors, and reading them allocates a
// bounded few MiB.
func TestPeerAnswerBounded(t *testing.T) {
	var body []byte
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	defer peer.Close()
	p, err := newPeerCheck(ReplicaOptions{Peer: peer.URL})
	if err != nil {
		t.Fatal(err)
	}
	empties := func(n int) []byte {
		return []byte(`{"workers":[{}` + strings.Repeat(`,{}`, n-1) + `]}`)
	}
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"10 MB", []byte(`{"workers":[` + strings.Repeat(`{"worker":"`+strings.Repeat("w", 200)+`"},`, 10<<20/214) + `{}]}`), "longer than"},
		{"too many workers", empties(maxPeerWorkers + 1), "more than"},
		{"a deep value", []byte(`{"workers":[{"worker":` + strings.Repeat("[", 1<<20) + `}]}`), ""},
	} {
		body = c.body
		before := allocated()
		ws, err := p.fetch(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %d workers, %v", c.name, len(ws), err)
		}
		if grown := allocated() - before; grown > 64<<20 {
			t.Fatalf("%s: reading the answer allocated %d MiB", c.name, grown>>20)
		}
	}
	body = []byte(`{"workers":[{"worker":"w","last_seq":7,"synced":true,"digest":{"sum":"00000000000000ff","blocks":3,"namespaces":{"":{"sum":"1","blocks":1}}},"endpoint":"x"}],"other":[1,2]}`)
	ws, err := p.fetch(context.Background())
	if err != nil || len(ws) != 1 || ws[0].Worker != "w" || *ws[0].LastSeq != 7 || !ws[0].Synced || ws[0].Digest.Sum != "00000000000000ff" || ws[0].Digest.Blocks != 3 {
		t.Fatalf("a good answer: %+v %v", ws, err)
	}
}

// TestPeerCheckCredentials (issue 33, row 9): the peer check could send no token nor
// trust a CA, so with authentication on every check failed with 401. Now it sends
// PeerTokenFile's first token and trusts PeerCAFile.
func TestPeerCheckCredentials(t *testing.T) {
	const tok = "a-peer-token-of-some-length"
	peer := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+tok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Write([]byte(`{"workers":[]}`))
	}))
	defer peer.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	tokens := filepath.Join(dir, "tokens")
	var pemBuf bytes.Buffer
	pem.Encode(&pemBuf, &pem.Block{Type: "CERTIFICATE", Bytes: peer.Certificate().Raw})
	if err := os.WriteFile(ca, pemBuf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte("# the peer's\n"+tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		opts ReplicaOptions
		ok   bool
	}{
		{ReplicaOptions{Peer: peer.URL, PeerCAFile: ca}, false},
		{ReplicaOptions{Peer: peer.URL, PeerTokenFile: tokens}, false},
		{ReplicaOptions{Peer: peer.URL, PeerCAFile: ca, PeerTokenFile: tokens}, true},
	} {
		p, err := newPeerCheck(c.opts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.fetch(context.Background())
		p.hc.CloseIdleConnections()
		if (err == nil) != c.ok {
			t.Fatalf("%+v: %v", c.opts, err)
		}
	}
	if _, err := newPeerCheck(ReplicaOptions{Peer: peer.URL, PeerCAFile: tokens}); err == nil {
		t.Fatal("a CA file without a certificate accepted")
	}
}

// allocated is the bytes allocated on the heap so far.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
