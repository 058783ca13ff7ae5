package kube_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/kube"
	"github.com/kvindex/kvindex/internal/kube/kubetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// follower runs a Watcher and keeps what it delivered.
type follower struct {
	mu      sync.Mutex
	last    []kube.Pod
	updates int
	status  error
	errs    []string // every failure reported
	cancel  context.CancelFunc
	done    chan struct{}
}

func follow(t *testing.T, cfg kube.Config) *follower {
	t.Helper()
	w, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		w.Run(ctx, func(pods []kube.Pod) {
			f.mu.Lock()
			f.last, f.updates = pods, f.updates+1
			f.mu.Unlock()
		}, func(err error) {
			f.mu.Lock()
			f.status = err
			if err != nil {
				f.errs = append(f.errs, err.Error())
			}
			f.mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-f.done })
	return f
}

// names returns the last delivered pods as "name=ip" strings.
func (f *follower) names() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.last {
		s := p.Name + "=" + p.IP
		if p.Terminating {
			s += "(terminating)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// failed reports whether a failure mentioning want was reported.
func (f *follower) failed(want string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.errs {
		if strings.Contains(e, want) {
			return true
		}
	}
	return false
}

func (f *follower) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // bounded poll of a condition
	}
}

func config(api *kubetest.Server) kube.Config {
	return kube.Config{APIServer: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile, Namespace: "llm",
		Selector: "app=vllm", BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond}
}

func vllm(name, ip string) kubetest.Pod {
	return kubetest.Pod{Namespace: "llm", Name: name, IP: ip, Ready: true, Labels: map[string]string{"app": "vllm"},
		Annotations: map[string]string{"kvindex.io/kv-events-port": "5557"}}
}

// TestWatchFollowsPods: the list, then every change through the watch, across a watch
// the server ends (resumed from its resource version, nothing missed), a compaction
// (410 Gone: listed again), bookmarks, a rotated token, a pod that stops matching the
// selector and pods of other namespaces and labels (never seen).
func TestWatchFollowsPods(t *testing.T) {
	for _, goneAtStart := range []bool{false, true} {
		t.Run(fmt.Sprintf("gone-at-start=%v", goneAtStart), func(t *testing.T) {
			api := kubetest.New(t)
			api.GoneAtStart = goneAtStart
			for i := range 3 {
				api.Apply(vllm(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.1.0.%d", i)))
			}
			api.Apply(kubetest.Pod{Namespace: "other", Name: "vllm-x", IP: "10.9.0.1", Labels: map[string]string{"app": "vllm"}})
			api.Apply(kubetest.Pod{Namespace: "llm", Name: "db", IP: "10.9.0.2", Labels: map[string]string{"app": "db"}})
			f := follow(t, config(api))
			want := func(s string) {
				t.Helper()
				waitFor(t, s, func() bool { return f.names() == s })
			}
			want("vllm-0=10.1.0.0,vllm-1=10.1.0.1,vllm-2=10.1.0.2")
			api.Delete("llm", "vllm-1")
			api.Apply(vllm("vllm-3", "10.1.0.3"))
			want("vllm-0=10.1.0.0,vllm-2=10.1.0.2,vllm-3=10.1.0.3")
			// The server ends the watch; changes meanwhile arrive through the next one.
			lists, _ := api.Counts()
			api.EndWatches()
			api.Apply(vllm("vllm-0", "10.1.0.100"))
			want("vllm-0=10.1.0.100,vllm-2=10.1.0.2,vllm-3=10.1.0.3")
			if l, _ := api.Counts(); l != lists {
				t.Fatalf("a watch that ended listed again (%d lists, was %d)", l, lists)
			}
			// A pod that stops matching is deleted; one being deleted says so.
			stray := vllm("vllm-2", "10.1.0.2")
			stray.Labels = map[string]string{"app": "other"}
			api.Apply(stray)
			dying := vllm("vllm-3", "10.1.0.3")
			dying.Deleting = true
			api.Apply(dying)
			want("vllm-0=10.1.0.100,vllm-3=10.1.0.3(terminating)")
			// Bookmarks move the resource version; a rotated token is read again.
			api.Bookmark()
			api.RotateToken(t)
			api.EndWatches()
			api.Apply(vllm("vllm-4", "10.1.0.4"))
			want("vllm-0=10.1.0.100,vllm-3=10.1.0.3(terminating),vllm-4=10.1.0.4")
			// Expiry: the watch ends with 410 Gone (an ERROR event, or the status of the
			// next watch) and the watcher lists again.
			api.Expire()
			api.Apply(vllm("vllm-5", "10.1.0.5"))
			want("vllm-0=10.1.0.100,vllm-3=10.1.0.3(terminating),vllm-4=10.1.0.4,vllm-5=10.1.0.5")
			if l, _ := api.Counts(); l <= lists {
				t.Fatalf("no list after 410 Gone (%d lists)", l)
			}
			if err := f.err(); err != nil {
				t.Fatalf("status after recovery: %v", err)
			}
		})
	}
}

// TestWatchHostileServer: what the API server sends is bounded and checked: an event
// past MaxObjectBytes, a line that is not JSON, an unknown event type, an ERROR event,
// a 401 and more pods than MaxPods each fail the attempt (reported, retried with a new
// list), never the process.
func TestWatchHostileServer(t *testing.T) {
	api := kubetest.New(t)
	api.Apply(vllm("vllm-0", "10.1.0.0"))
	cfg := config(api)
	cfg.MaxObjectBytes, cfg.MaxPods = 8192, 3
	f := follow(t, cfg)
	waitFor(t, "the list", func() bool { return f.names() == "vllm-0=10.1.0.0" })
	for _, tc := range []struct{ line, want string }{
		{`{"type":"ADDED","object":{"metadata":{"name":"` + strings.Repeat("x", 9000) + `"}}}`, "larger than 8192"},
		{`{"type":"ADDED","object":`, "watch event"},
		{`{"type":"SURPRISE","object":{}}`, "unknown watch event type"},
		{`{"type":"ERROR","object":{"kind":"Status","code":500,"reason":"InternalError","message":"etcd"}}`, "watch error 500"},
		{`{"type":"ADDED","object":{"metadata":{"name":""}}}`, "empty or overlong name"},
	} {
		lists, _ := api.Counts()
		api.Inject(tc.line)
		waitFor(t, tc.want, func() bool { return f.failed(tc.want) })
		waitFor(t, "a new list", func() bool { l, _ := api.Counts(); return l > lists && f.err() == nil })
	}
	// More pods than allowed: the list fails until there are fewer again.
	for i := 1; i <= 3; i++ {
		api.Apply(vllm(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.1.0.%d", i)))
	}
	waitFor(t, "too many pods", func() bool { return f.failed("more than 3 pods") })
	api.Delete("llm", "vllm-3")
	waitFor(t, "three pods", func() bool { return f.names() == "vllm-0=10.1.0.0,vllm-1=10.1.0.1,vllm-2=10.1.0.2" && f.err() == nil })
	// A wrong token: 401, reported.
	if err := os.WriteFile(api.TokenFile, []byte("stolen"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "401", func() bool {
		api.EndWatches() // a watch opened with the old token just before stays open otherwise
		return f.failed("401")
	})
}

// TestNewChecksConfig: what New refuses, each naming why.
func TestNewChecksConfig(t *testing.T) {
	api := kubetest.New(t)
	good := config(api)
	if _, err := kube.New(good); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	for _, tc := range []struct {
		edit func(*kube.Config)
		want string
	}{
		{func(c *kube.Config) { c.Selector = "" }, "label selector is required"},
		{func(c *kube.Config) { c.Selector = "a=\n" }, "control byte"},
		{func(c *kube.Config) { c.Namespace = "Bad_NS" }, "namespace"},
		{func(c *kube.Config) { c.APIServer = "ftp://x" }, "api server"},
		{func(c *kube.Config) { c.TokenFile = empty }, "empty"},
		{func(c *kube.Config) { c.TokenFile = empty + ".missing" }, "token"},
		{func(c *kube.Config) { c.CAFile = empty }, "no PEM certificate"},
		{func(c *kube.Config) { c.MaxObjectBytes = 10 }, "max object bytes"},
	} {
		c := good
		tc.edit(&c)
		if _, err := kube.New(c); !errors.Is(err, kube.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want ErrConfig mentioning %q", err, tc.want)
		}
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c := good
	c.APIServer = ""
	if _, err := kube.New(c); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("no API server: %v", err)
	}
}
