package server_test

import (
	"bytes"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/kube/kubetest"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// lockedLog is a log buffer safe for the server's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func port(t *testing.T, endpoint string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubeDiscovery: pods that match the selector become engines (their KV-event and
// replay ports from annotations, their data-parallel ranks too), their events apply,
// and a pod that goes (deleted, stops matching, starts terminating) takes its workers
// out of the index while the others' subscribers go on; pods without the annotation
// are not engines, pods whose annotations do not parse are skipped and logged.
func TestKubeDiscovery(t *testing.T) {
	pubtest.Require(t)
	var pubs []*pubtest.Publisher
	for _, opts := range []pubtest.Options{{Bind: true}, {Bind: true}, {Bind: true, Ranks: 2, ConsecutivePorts: true}} {
		p, err := pubtest.Start(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pubs = append(pubs, p)
	}
	api := kubetest.New(t)
	pod := func(name string, pub *pubtest.Publisher, extra map[string]string) kubetest.Pod {
		ann := map[string]string{server.DefaultPortAnnotation: port(t, pub.Ranks[0].Endpoint),
			server.DefaultReplayPortAnnotation: port(t, pub.Ranks[0].ReplayEndpoint)}
		for k, v := range extra {
			ann[k] = v
		}
		return kubetest.Pod{Namespace: "llm", Name: name, IP: "127.0.0.1", Ready: true,
			Labels: map[string]string{"app": "vllm"}, Annotations: ann}
	}
	api.Apply(pod("vllm-0", pubs[0], nil))
	api.Apply(pod("vllm-1", pubs[1], nil))
	api.Apply(pod("vllm-dp", pubs[2], map[string]string{server.DefaultDPRanksAnnotation: "2", server.DefaultModelAnnotation: "m"}))
	api.Apply(kubetest.Pod{Namespace: "llm", Name: "no-annotation", IP: "127.0.0.1", Labels: map[string]string{"app": "vllm"}})
	api.Apply(pod("bad-port", pubs[0], map[string]string{server.DefaultPortAnnotation: "http"}))
	var logs lockedLog
	cfg := server.Config{Listen: "127.0.0.1:0", ReconnectMin: server.Duration(10 * time.Millisecond),
		Discovery: server.DiscoveryConfig{Kubernetes: &server.KubeDiscovery{Selector: "app=vllm", Namespace: "llm",
			APIServer: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile,
			Engine: server.EngineConfig{Model: "m", BlockSize: 4}}}}
	s, err := server.New(cfg, server.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(t.Context()) })
	c := newClient(t, s.Addr())
	c.waitReady(t)
	workers := func() []string {
		var out []string
		for _, w := range h(c) {
			out = append(out, w.Worker)
		}
		slices.Sort(out)
		return out
	}
	if got := workers(); !slices.Equal(got, []string{"vllm-0", "vllm-1", "vllm-dp#dp0", "vllm-dp#dp1"}) {
		t.Fatalf("workers %v", got)
	}
	if !strings.Contains(logs.String(), "pod=bad-port") || !strings.Contains(logs.String(), `\"http\" is not a port`) {
		t.Fatalf("the bad pod is not logged: %s", logs.String())
	}
	// Events flow: each engine's batch reaches its worker.
	toks := []uint32{1, 2, 3, 4}
	for i, p := range pubs {
		if _, err := p.Publish(0, true, pubtest.Event{Type: "BlockStored", BlockHashes: []uint64{uint64(10 + i)}, TokenIDs: toks, BlockSize: 4}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every first batch applied", func() bool {
		n := 0
		for _, w := range h(c) {
			if w.Size != nil && *w.Size == 1 {
				n++
			}
		}
		return n == 3
	})
	sub0 := subscriberOf(s, "vllm-0")
	// vllm-1 is deleted, vllm-dp starts terminating: only vllm-0 is left, untouched.
	api.Delete("llm", "vllm-1")
	dying := pod("vllm-dp", pubs[2], map[string]string{server.DefaultDPRanksAnnotation: "2"})
	dying.Deleting = true
	api.Apply(dying)
	// The fleet changes first, then the workers leave the index.
	waitFor(t, "vllm-0 alone, in the fleet and in the index", func() bool {
		for _, w := range []string{"vllm-1", "vllm-dp#dp0", "vllm-dp#dp1"} {
			if _, ok := s.Engine().WorkerSize(w); ok {
				return false
			}
		}
		return slices.Equal(workers(), []string{"vllm-0"})
	})
	if subscriberOf(s, "vllm-0") != sub0 {
		t.Fatal("vllm-0's subscriber was replaced")
	}
	// A pod that stops matching the selector goes too.
	gone := pod("vllm-0", pubs[0], nil)
	gone.Labels = map[string]string{"app": "retired"}
	api.Apply(gone)
	waitFor(t, "no workers", func() bool { return len(workers()) == 0 })
	// The change is counted once it is complete.
	waitFor(t, "the changes counted", func() bool {
		m := c.text("/metrics")
		for _, want := range []string{`kvindex_discovery_up{source="kubernetes"} 1`, `kvindex_engines{source="kubernetes"} 0`,
			`kvindex_engine_changes_total{change="added",source="kubernetes"} 3`, `kvindex_engine_changes_total{change="removed",source="kubernetes"} 3`} {
			if !strings.Contains(m, want) {
				return false
			}
		}
		return true
	})
}

func h(c *client) []server.WorkerInfo {
	var ws struct{ Workers []server.WorkerInfo }
	c.do("GET", "/v1/workers", "", &ws)
	return ws.Workers
}

func subscriberOf(s *server.Server, worker string) any {
	for _, sub := range s.Subscribers() {
		if sub.Worker() == worker {
			return sub
		}
	}
	return nil
}

// TestKubeDiscoveryConfig: what New refuses about Kubernetes discovery.
func TestKubeDiscoveryConfig(t *testing.T) {
	api := kubetest.New(t)
	base := server.KubeDiscovery{Selector: "app=vllm", Namespace: "llm", APIServer: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile}
	for _, tc := range []struct {
		edit func(*server.KubeDiscovery)
		want string
	}{
		{func(k *server.KubeDiscovery) { k.Selector = "" }, "selector is required"},
		{func(k *server.KubeDiscovery) { k.Engine.Endpoint = "tcp://h:1" }, "come from each pod"},
		{func(k *server.KubeDiscovery) { k.Engine.BlockSize = -1 }, "block_size"},
		{func(k *server.KubeDiscovery) { k.CAFile = api.TokenFile }, "no PEM certificate"},
		{func(k *server.KubeDiscovery) { k.Namespace = "NOPE" }, "namespace"},
	} {
		kd := base
		tc.edit(&kd)
		s, err := server.New(server.Config{Discovery: server.DiscoveryConfig{Kubernetes: &kd}}, server.Options{})
		if err == nil {
			s.Shutdown(t.Context())
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", kd, err, tc.want)
		}
	}
}
