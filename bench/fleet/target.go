package fleet

import (
	"github.com/kvindex/kvindex/internal/fakevllm"

	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/server"
)

// target is the serve under test: in this process (server.Server) or a child process
// running the real binary (kvindex serve --config FILE).
type target interface {
	httpAddr() string
	grpcAddr() string
	// pid is the process whose resources are the server's (this one for in-process).
	pid() int
	// goroutines reads the server's goroutine count.
	goroutines(ctx context.Context) (int, error)
	// stop halts and resumes the server's process (SIGSTOP/SIGCONT; false when the
	// server runs in this process).
	signal(sig os.Signal) bool
	close() error
	// failed reports a fatal error of the server, if any.
	failed() error
}

// serverConfig is the serve configuration for the fleet.
func serverConfig(f *fakevllm.Fleet, rc *Config) server.Config {
	cfg := server.Config{
		Listen:    "127.0.0.1:0",
		BlockSize: f.Config().Workload.BlockSize,
		GRPC:      server.GRPCConfig{Listen: "127.0.0.1:0"},
		Index:     server.IndexConfig{Shards: rc.Shards},
		Grace:     server.Duration(-1),
		// The run checks every worker at the end; the diagnostics' timers are not
		// under test.
		Diagnose: server.DiagnoseConfig{NoEventsAfter: server.Duration(-1), IdleAfter: server.Duration(-1)},
	}
	if rc.ResyncInterval != 0 {
		cfg.ResyncInterval = server.Duration(rc.ResyncInterval)
	}
	cfg.MaxConcurrentReplays = rc.MaxConcurrentReplays
	if rc.ReplayTimeout != 0 {
		cfg.ReplayTimeout = server.Duration(rc.ReplayTimeout)
	}
	for i := range f.Engines() {
		pub, rep := f.Endpoints(i)
		cfg.Engines = append(cfg.Engines, server.EngineConfig{
			Endpoint: pub, ReplayEndpoint: rep, Worker: fakevllm.WorkerName(i), Model: fakevllm.Model, Bind: f.Config().Connect,
		})
	}
	return cfg
}

// inproc is a server.Server in this process.
type inproc struct {
	s *server.Server
}

func startInproc(cfg server.Config) (*inproc, error) {
	s, err := server.New(cfg, server.Options{})
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		_ = s.Shutdown(context.Background())
		return nil, err
	}
	return &inproc{s: s}, nil
}

func (t *inproc) httpAddr() string                        { return t.s.Addr() }
func (t *inproc) grpcAddr() string                        { return t.s.GRPCAddr() }
func (t *inproc) pid() int                                { return os.Getpid() }
func (t *inproc) goroutines(context.Context) (int, error) { return runtime.NumGoroutine(), nil }
func (t *inproc) signal(os.Signal) bool                   { return false }
func (t *inproc) failed() error {
	select {
	case err := <-t.s.Errors():
		return err
	default:
		return nil
	}
}

func (t *inproc) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return t.s.Shutdown(ctx)
}

// child is the real binary: command ... serve --config FILE, its addresses read from
// the lines it prints on stdout.
type child struct {
	cmd        *exec.Cmd
	dir        string
	http, grpc string
	stderr     *tailBuffer
	logw       io.Writer
	done       chan struct{}
	waitErr    error
}

// startChild runs command (e.g. [/path/kvindex serve]) with the configuration; with a
// profile path, the child writes its CPU profile there (KVINDEX_CPUPROFILE).
func startChild(command []string, cfg server.Config, profile string, logw io.Writer) (*child, error) {
	if len(command) == 0 {
		return nil, errors.New("fleet: empty serve command")
	}
	dir, err := os.MkdirTemp("", "kvindex-loadtest-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "serve.json")
	b, err := json.Marshal(cfg)
	if err == nil {
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := append(append([]string(nil), command[1:]...), "--config", path, "--log-level", "warn")
	c := &child{cmd: exec.Command(command[0], args...), dir: dir, stderr: &tailBuffer{max: 64 << 10}, logw: logw, done: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	if profile != "" {
		c.cmd.Env = append(os.Environ(), "KVINDEX_CPUPROFILE="+profile)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("fleet: start %s: %w", command[0], err)
	}
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.done)
	}()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	for c.http == "" || c.grpc == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				<-c.done
				os.RemoveAll(dir)
				return nil, fmt.Errorf("fleet: serve exited (%v) before listening: %s", c.waitErr, c.stderr)
			}
			if a, ok := strings.CutPrefix(l, "kvindex serve: listening on "); ok {
				c.http, _, _ = strings.Cut(a, " ")
			}
			if a, ok := strings.CutPrefix(l, "kvindex serve: gRPC on "); ok {
				c.grpc = a
			}
		case <-timeout.C:
			_ = c.close()
			return nil, errors.New("fleet: serve did not print its addresses within 2m")
		}
	}
	go func() { // keep draining stdout
		for range lines {
		}
	}()
	fmt.Fprintf(logw, "serve: pid %d, http %s, grpc %s\n", c.cmd.Process.Pid, c.http, c.grpc)
	return c, nil
}

func (c *child) httpAddr() string { return c.http }
func (c *child) grpcAddr() string { return c.grpc }
func (c *child) pid() int         { return c.cmd.Process.Pid }
func (c *child) signal(sig os.Signal) bool {
	return c.cmd.Process.Signal(sig) == nil
}

func (c *child) failed() error {
	select {
	case <-c.done:
		return fmt.Errorf("fleet: serve exited: %v: %s", c.waitErr, c.stderr)
	default:
		return nil
	}
}

// goroutines reads go_goroutines from the child's /metrics.
func (c *child) goroutines(ctx context.Context) (int, error) {
	body, err := get(ctx, http.DefaultClient, c.http, "/metrics")
	if err != nil {
		return 0, err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, errors.New("fleet: go_goroutines not in /metrics")
}

func (c *child) close() error {
	defer os.RemoveAll(c.dir)
	if tail := c.stderr.String(); tail != "" && c.logw != nil {
		if len(tail) > 64<<10 {
			tail = "..." + tail[len(tail)-64<<10:]
		}
		fmt.Fprintf(c.logw, "serve's log (last lines):\n%s\n", tail)
	}
	if contSignal != nil {
		_ = c.cmd.Process.Signal(contSignal)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	var ee *exec.ExitError
	if c.waitErr != nil && !errors.As(c.waitErr, &ee) {
		return c.waitErr
	}
	if c.waitErr != nil {
		return fmt.Errorf("fleet: serve: %v: %s", c.waitErr, c.stderr)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// workerState is the part of GET /v1/workers the run checks.
type workerState struct {
	Worker  string  `json:"worker"`
	State   string  `json:"state"`
	Size    *int    `json:"size"`
	LastSeq *uint64 `json:"last_seq"`
	Batches uint64  `json:"batches"`
	Replays uint64  `json:"replays"`
	Gaps    struct {
		Detected      uint64 `json:"detected"`
		Recovered     uint64 `json:"recovered"`
		Unrecoverable uint64 `json:"unrecoverable"`
	} `json:"gaps"`
	Restarts uint64 `json:"restarts"`
}

// get is the body of GET http://addr+path, an error unless it answers 200.
func get(ctx context.Context, hc *http.Client, addr, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return resp.Body, nil
}

// fetchWorkers reads GET /v1/workers.
func fetchWorkers(ctx context.Context, hc *http.Client, addr string) (map[string]workerState, error) {
	r, err := get(ctx, hc, addr, "/v1/workers")
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var body struct {
		Workers []workerState `json:"workers"`
	}
	if err := json.NewDecoder(r).Decode(&body); err != nil {
		return nil, fmt.Errorf("/v1/workers: %w", err)
	}
	out := make(map[string]workerState, len(body.Workers))
	for _, w := range body.Workers {
		out[w.Worker] = w
	}
	return out, nil
}

// waitReady polls /readyz until it answers 200.
func waitReady(ctx context.Context, hc *http.Client, addr string, t target) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := t.failed(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: serve not ready: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dialGRPC connects the gRPC client.
func dialGRPC(addr string) (*client.Client, error) {
	if addr == "" {
		return nil, errors.New("fleet: serve has no gRPC address")
	}
	return client.Dial(addr)
}

// procStats are one process's resources from /proc.
type procStats struct {
	RSS     int64         // resident bytes
	FDs     int           // open file descriptors
	CPU     time.Duration // user + system time so far
	Threads int
}

// readProc reads /proc/PID (Linux; zero values elsewhere).
func readProc(pid int) (procStats, error) {
	var st procStats
	base := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(base + "/status")
	if err != nil {
		return st, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			st.RSS = kb << 10
		}
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			st.Threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	stat, err := os.ReadFile(base + "/stat")
	if err != nil {
		return st, err
	}
	// Fields after the command (which may hold spaces) start after the last ')'.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 13 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			stt, _ := strconv.ParseInt(f[12], 10, 64)
			st.CPU = time.Duration(ut+stt) * time.Second / 100 // USER_HZ is 100 on Linux
		}
	}
	if ents, err := os.ReadDir(base + "/fd"); err == nil {
		st.FDs = len(ents)
	}
	return st, nil
}

// loadAverage returns the 1-minute load average ("" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
