package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/fakevllm"
)

// The query child. With an exec serve the load generator runs 10 nicer than serve
// (Config.LoadgenNice), so that serve's CPU figures are serve's; but a match client in
// the generator then waits for a core behind serve and the 64-2,048 engines, on its
// timer, in its HTTP and gRPC transports' goroutines, and that wait was most of the
// clients' p99. With Config.QueryCommand the match clients run in a child process
// started before the generator lowers its priority, so at serve's priority, as a router
// on its own machine would: the generator feeds it recent request chains (the fleet's
// SamplePrompt pool) and tells it when a level starts and stops; it returns every
// query's latency, from its schedule and from its send. The lag probes stay in the
// generator (they time the fleet's own batches).
//
// The protocol is JSON lines: the generator writes queryChildMsg values to the child's
// stdin (the addresses first, then prompts, start and stop in any order), and the child
// answers each stop with one queryChildResult line on its stdout. The child exits when
// its stdin closes.

// queryChildEnv names the environment variable that makes a process the query child
// (IsQueryChild).
const queryChildEnv = "KVINDEX_LOADTEST_QUERY_CHILD"

// IsQueryChild reports whether this process was started as a load test's query child:
// its caller then runs QueryChild instead of its usual work.
func IsQueryChild() bool { return os.Getenv(queryChildEnv) == "1" }

// queryChildMsg is one message to the child. Exactly one group of fields is set.
type queryChildMsg struct {
	HTTP    string      `json:"http,omitempty"` // serve's HTTP and gRPC addresses, and the clients
	GRPC    string      `json:"grpc,omitempty"`
	Clients int         `json:"clients,omitempty"`
	Prompts [][]uint64  `json:"prompts,omitempty"` // the pool to sample queries from, replacing the last
	Start   *childLevel `json:"start,omitempty"`
	Stop    bool        `json:"stop,omitempty"`
}

// childLevel is a level's query load.
type childLevel struct {
	Rate float64  `json:"rate"`
	APIs []string `json:"apis"`
	Seed uint64   `json:"seed"`
}

// queryChildResult is a level's queries, as queryLoad keeps them.
type queryChildResult struct {
	Lat     map[string][]time.Duration `json:"lat"`
	Sent    map[string][]time.Duration `json:"sent"`
	Errs    map[string]int             `json:"errs"`
	LastErr string                     `json:"last_err,omitempty"`
	Skipped int64                      `json:"skipped"`
}

// promptPool is the child's prompts, replaced by each Prompts message.
type promptPool struct {
	mu      sync.Mutex
	prompts [][]uint64
}

func (p *promptPool) set(prompts [][]uint64) {
	p.mu.Lock()
	p.prompts = prompts
	p.mu.Unlock()
}

// SamplePrompt copies a random prompt of the pool into dst (false when it is empty).
func (p *promptPool) SamplePrompt(rng *rand.Rand, dst []uint64) ([]uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fakevllm.SampleFrom(p.prompts, rng, dst)
}

// maxChildPrompts is how many prompts the generator samples for the child at a time
// (every feedEvery): enough variety for 200 queries a second, little enough that the
// pipe's JSON costs the child (at serve's priority) next to nothing.
const maxChildPrompts = 64

// QueryChild is the query child's side: it reads messages from in until in closes,
// runs each level's queries against serve and writes a result line to out at each
// stop.
func QueryChild(in io.Reader, out io.Writer) error {
	dec := json.NewDecoder(bufio.NewReader(in))
	enc := json.NewEncoder(out)
	pool := &promptPool{}
	var matchers map[string]matcher
	var closeGRPC func() error
	defer func() {
		if closeGRPC != nil {
			_ = closeGRPC()
		}
	}()
	clients := 0
	var run *childRun // the level running, or nil
	defer func() {
		if run != nil {
			run.stop()
		}
	}()
	for {
		var m queryChildMsg
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("fleet: query child: %w", err)
		}
		switch {
		case m.HTTP != "":
			if matchers != nil {
				return errors.New("fleet: query child: the addresses twice")
			}
			if m.Clients < 1 {
				return errors.New("fleet: query child: no clients")
			}
			gc, err := dialGRPC(m.GRPC)
			if err != nil {
				return err
			}
			closeGRPC = gc.Close
			clients = m.Clients
			matchers = map[string]matcher{APIHTTP: newHTTPMatcher(m.HTTP, clients+8), APIGRPC: grpcMatcher{gc}}
		case m.Prompts != nil:
			pool.set(m.Prompts)
		case m.Start != nil:
			if matchers == nil || run != nil {
				return errors.New("fleet: query child: a level started before the addresses or inside another")
			}
			q := newQueryLoad(pool, m.Start.APIs, matchers, m.Start.Rate, clients)
			ctx, cancel := context.WithCancel(context.Background())
			run = &childRun{q: q, cancel: cancel, done: make(chan struct{})}
			go func(r *childRun, seed uint64) {
				defer close(r.done)
				r.q.run(ctx, seed)
			}(run, m.Start.Seed)
		case m.Stop:
			if run == nil {
				return errors.New("fleet: query child: a stop outside a level")
			}
			run.stop()
			q := run.q
			run = nil
			res := queryChildResult{Lat: q.lat, Sent: q.sent, Errs: q.errs, Skipped: q.skipped.Load()}
			if q.lastErr != nil {
				res.LastErr = q.lastErr.Error()
			}
			if err := enc.Encode(&res); err != nil {
				return err
			}
		}
	}
}

// childRun is a level running in the query child.
type childRun struct {
	q      *queryLoad
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the level's queries and waits for its clients.
func (r *childRun) stop() {
	r.cancel()
	<-r.done
}

// queryProc is the generator's side: the child process and its pipes. The child is
// waited for only in close, after every read of its stdout (exec.Cmd.Wait closes the
// pipe).
type queryProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	enc *json.Encoder
	out *json.Decoder
}

// startQueryProc starts command as the query child (the caller lowers its own priority
// afterwards, so the child keeps the caller's).
func startQueryProc(command []string, stderr io.Writer) (*queryProc, error) {
	if len(command) == 0 {
		return nil, errors.New("fleet: empty query command")
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(os.Environ(), queryChildEnv+"=1")
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fleet: start the query child %s: %w", command[0], err)
	}
	return &queryProc{cmd: cmd, in: in, enc: json.NewEncoder(in), out: json.NewDecoder(bufio.NewReader(out))}, nil
}

// setup tells the child serve's addresses and its number of clients.
func (p *queryProc) setup(httpAddr, grpcAddr string, clients int) error {
	return p.enc.Encode(&queryChildMsg{HTTP: httpAddr, GRPC: grpcAddr, Clients: clients})
}

// runLevel is queryLoad.run through the child: it starts the level there, sends prompts
// from src every feedEvery until ctx ends, then stops the level and copies the child's
// figures into q.
func (p *queryProc) runLevel(ctx context.Context, q *queryLoad, src promptSource, seed uint64) error {
	if q.rate <= 0 || len(q.apis) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	feed := func() error {
		var prompts [][]uint64
		for range maxChildPrompts {
			c, ok := src.SamplePrompt(rng, nil)
			if !ok {
				break
			}
			prompts = append(prompts, c)
		}
		if prompts == nil {
			return nil
		}
		return p.enc.Encode(&queryChildMsg{Prompts: prompts})
	}
	if err := feed(); err != nil {
		return err
	}
	if err := p.enc.Encode(&queryChildMsg{Start: &childLevel{Rate: q.rate, APIs: q.apis, Seed: seed}}); err != nil {
		return err
	}
	tick := time.NewTicker(feedEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			if err := feed(); err != nil {
				return err
			}
		case <-ctx.Done():
		}
	}
	if err := p.enc.Encode(&queryChildMsg{Stop: true}); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	res := queryChildResult{Lat: q.lat, Sent: q.sent, Errs: q.errs} // decoded into q's own maps
	if err := p.out.Decode(&res); err != nil {
		return fmt.Errorf("fleet: the query child's result: %w", err)
	}
	if res.LastErr != "" {
		q.lastErr = errors.New(res.LastErr)
	}
	q.skipped.Store(res.Skipped)
	return nil
}

// feedEvery is how often the generator sends the child a fresh sample of prompts.
const feedEvery = 500 * time.Millisecond

// close ends the child: its stdin closes and it exits (killed after a few seconds).
func (p *queryProc) close() error {
	_ = p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		return <-done
	}
}
