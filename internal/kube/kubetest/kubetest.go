// Package kubetest is a fake Kubernetes API server for the pods of one cluster, enough
// for package kube's list and watch: TLS with its own CA, a bearer token that can
// rotate, label selectors of "key=value" terms, paginated lists, watches from a
// resource version (with the DELETED events a selector implies when a pod stops
// matching), bookmarks, and 410 Gone once history is compacted. Tests drive it with
// Apply, Delete, Compact, Expire, EndWatches and Inject; it is safe for concurrent use.
//
// Who may call it: tests of package kube and of the server's Kubernetes discovery.
package kubetest

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Pod is a pod as a test writes it.
type Pod struct {
	Namespace   string
	Name        string
	IP          string
	Phase       string // default Running
	Ready       bool
	Deleting    bool
	Labels      map[string]string
	Annotations map[string]string
}

// Server is the fake API server.
type Server struct {
	URL       string
	CAFile    string
	TokenFile string

	srv *httptest.Server
	dir string

	mu      sync.Mutex
	token   string
	rv      int
	pods    map[string]stored // by namespace/name
	history []event
	oldest  int           // watches from before this resource version get 410
	wake    chan struct{} // closed and replaced on every change
	endGen  int           // EndWatches increments it
	inject  []string      // raw lines for the next watch to write them
	lists   int
	watches int
	// GoneAtStart answers an expired watch with HTTP 410 instead of an ERROR event.
	GoneAtStart bool
}

type stored struct {
	pod Pod
	rv  int
}

type event struct {
	rv       int
	old, new *stored // old nil: created; new nil: deleted
}

// New starts a fake API server; Close stops it (t.Cleanup does).
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{token: "token-1", pods: map[string]stored{}, wake: make(chan struct{}), rv: 100, oldest: 0, dir: t.TempDir()}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	s.CAFile = filepath.Join(s.dir, "ca.crt")
	s.TokenFile = filepath.Join(s.dir, "token")
	pem := certPEM(s.srv.Certificate().Raw)
	if err := os.WriteFile(s.CAFile, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	s.writeToken(t)
	t.Cleanup(s.Close)
	return s
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func (s *Server) writeToken(t testing.TB) {
	if err := os.WriteFile(s.TokenFile, []byte(s.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Close stops the server, ending open watches.
func (s *Server) Close() {
	s.EndWatches()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// RotateToken makes the server accept only a new token, written to TokenFile.
func (s *Server) RotateToken(t testing.TB) {
	s.mu.Lock()
	n, _ := strconv.Atoi(strings.TrimPrefix(s.token, "token-"))
	s.token = fmt.Sprintf("token-%d", n+1)
	s.writeToken(t)
	s.mu.Unlock()
}

// Counts returns the lists and watches served so far.
func (s *Server) Counts() (lists, watches int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists, s.watches
}

func (s *Server) changed() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// Apply creates or replaces a pod.
func (s *Server) Apply(p Pod) {
	if p.Phase == "" {
		p.Phase = "Running"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := p.Namespace + "/" + p.Name
	s.rv++
	ev := event{rv: s.rv, new: &stored{pod: p, rv: s.rv}}
	if old, ok := s.pods[key]; ok {
		ev.old = &old
	}
	s.pods[key] = *ev.new
	s.history = append(s.history, ev)
	s.changed()
}

// Delete deletes a pod (no-op when absent).
func (s *Server) Delete(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := namespace + "/" + name
	old, ok := s.pods[key]
	if !ok {
		return
	}
	s.rv++
	delete(s.pods, key)
	old.rv = s.rv
	s.history = append(s.history, event{rv: s.rv, old: &old})
	s.changed()
}

// Compact forgets the history up to now: a watch from an older resource version gets
// 410 Gone.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history, s.oldest = nil, s.rv+1
	s.changed()
}

// Expire makes every resource version handed out so far too old, as a compaction
// while a client was away would: open watches end with 410 Gone, and so does every
// watch from them.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.history, s.oldest = nil, s.rv+1
	s.changed()
}

// EndWatches ends every open watch, as the server's timeout would.
func (s *Server) EndWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endGen++
	s.changed()
}

// Inject sends a raw line (without its newline) on the open watch, or the next one to
// open (each line is sent once).
func (s *Server) Inject(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inject = append(s.inject, line)
	s.changed()
}

// Bookmark sends a bookmark at the current resource version (as Inject does).
func (s *Server) Bookmark() {
	s.mu.Lock()
	rv := s.rv
	s.mu.Unlock()
	s.Inject(fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"%d"}}}`, rv))
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	tok := s.token
	s.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+tok {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "bad token")
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 5 || parts[0] != "api" || parts[1] != "v1" || parts[2] != "namespaces" || parts[4] != "pods" {
		writeStatus(w, http.StatusNotFound, "NotFound", "no such path "+r.URL.Path)
		return
	}
	sel, err := parseSelector(r.URL.Query().Get("labelSelector"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	ns := parts[3]
	if r.URL.Query().Get("watch") == "true" {
		s.watch(w, r, ns, sel)
		return
	}
	s.list(w, r, ns, sel)
}

type selector map[string]string

func parseSelector(q string) (selector, error) {
	sel := selector{}
	for _, term := range strings.Split(q, ",") {
		k, v, ok := strings.Cut(term, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("unable to parse requirement %q", term)
		}
		sel[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return sel, nil
}

func (sel selector) matches(p Pod) bool {
	for k, v := range sel {
		if p.Labels[k] != v {
			return false
		}
	}
	return true
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(statusObject(code, reason, msg))
}

func statusObject(code int, reason, msg string) map[string]any {
	return map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
		"message": msg, "reason": reason, "code": code}
}

// object is a pod's JSON as the API server writes it (the fields a client reads, and
// some it does not).
func object(st stored) map[string]any {
	p := st.pod
	meta := map[string]any{"name": p.Name, "namespace": p.Namespace, "uid": "uid-" + p.Namespace + "-" + p.Name,
		"resourceVersion": strconv.Itoa(st.rv), "creationTimestamp": "2026-01-01T00:00:00Z",
		"labels": p.Labels, "annotations": p.Annotations, "generateName": "vllm-"}
	if p.Deleting {
		meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
	}
	ready := "False"
	if p.Ready {
		ready = "True"
	}
	status := map[string]any{"phase": p.Phase, "hostIP": "10.0.0.1",
		"conditions":        []map[string]any{{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": ready}},
		"containerStatuses": []map[string]any{{"name": "vllm", "ready": p.Ready, "restartCount": 0}}}
	if p.IP != "" {
		status["podIP"] = p.IP
		status["podIPs"] = []map[string]any{{"ip": p.IP}}
	}
	return map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": meta,
		"spec": map[string]any{"containers": []map[string]any{{"name": "vllm", "image": "vllm/vllm-openai"}}}, "status": status}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, ns string, sel selector) {
	s.mu.Lock()
	s.lists++
	var items []map[string]any
	var names []string
	for key, st := range s.pods {
		if st.pod.Namespace == ns && sel.matches(st.pod) {
			names = append(names, key)
		}
	}
	slices.Sort(names)
	start := 0
	if c := r.URL.Query().Get("continue"); c != "" {
		start, _ = strconv.Atoi(c)
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	end := len(names)
	cont := ""
	if limit > 0 && start+limit < len(names) {
		end, cont = start+limit, strconv.Itoa(start+limit)
	}
	for _, key := range names[min(start, len(names)):end] {
		items = append(items, object(s.pods[key]))
	}
	rv := s.rv
	s.mu.Unlock()
	if items == nil {
		items = []map[string]any{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1",
		"metadata": map[string]any{"resourceVersion": strconv.Itoa(rv), "continue": cont}, "items": items})
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, ns string, sel selector) {
	from, err := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "resourceVersion required")
		return
	}
	timeout := 300 * time.Second
	if t, err := strconv.Atoi(r.URL.Query().Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	s.mu.Lock()
	s.watches++
	gone := from < s.oldest-1
	if gone && s.GoneAtStart {
		s.mu.Unlock()
		writeStatus(w, http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d", from))
		return
	}
	gen := s.endGen
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	if gone {
		enc.Encode(map[string]any{"type": "ERROR", "object": statusObject(http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d", from))})
		return
	}
	cursor := from
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		if s.endGen != gen {
			s.mu.Unlock()
			return
		}
		if cursor < s.oldest-1 {
			s.mu.Unlock()
			enc.Encode(map[string]any{"type": "ERROR", "object": statusObject(http.StatusGone, "Expired", "too old resource version")})
			return
		}
		var out []map[string]any
		for _, ev := range s.history {
			if ev.rv <= cursor {
				continue
			}
			cursor = ev.rv
			if m := s.view(ev, ns, sel); m != nil {
				out = append(out, m)
			}
		}
		lines := s.inject
		s.inject = nil
		wake := s.wake
		s.mu.Unlock()
		for _, m := range out {
			if enc.Encode(m) != nil {
				return
			}
		}
		for _, l := range lines {
			if _, err := w.Write([]byte(l + "\n")); err != nil {
				return
			}
		}
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		case <-deadline:
			return
		}
	}
}

// view is an event as a watch with the selector sees it, or nil.
func (s *Server) view(ev event, ns string, sel selector) map[string]any {
	in := func(st *stored) bool { return st != nil && st.pod.Namespace == ns && sel.matches(st.pod) }
	switch oldIn, newIn := in(ev.old), in(ev.new); {
	case newIn && !oldIn:
		return map[string]any{"type": "ADDED", "object": object(*ev.new)}
	case newIn:
		return map[string]any{"type": "MODIFIED", "object": object(*ev.new)}
	case oldIn:
		last := *ev.old
		last.rv = ev.rv
		if ev.new != nil {
			last = *ev.new // still exists, no longer matches: the last state
		}
		return map[string]any{"type": "DELETED", "object": object(last)}
	}
	return nil
}
