package fleet

import (
	"github.com/kvindex/kvindex/internal/fakevllm"

	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/kvindex/kvindex/client"
)

// Server modes.
const (
	ServerInproc = "inproc" // server.Server in this process
	ServerExec   = "exec"   // the real binary, Config.ServeCommand
)

// Config is one load test: a fleet, a serve, and load levels run one after the other
// on them. Zero fields take the defaults.
type Config struct {
	Fleet fakevllm.FleetConfig
	// Server is ServerExec (default when ServeCommand is set) or ServerInproc.
	Server string
	// ServeCommand runs serve: the binary and the arguments before --config, e.g.
	// [/usr/local/bin/kvindex serve].
	ServeCommand []string
	// Shards is the index's shard count (0: serve's default).
	Shards int
	// ReplayTimeout and ResyncInterval are serve's (0: its defaults, 5s and 30s);
	// MaxConcurrentReplays its max_concurrent_replays (0: its default).
	ReplayTimeout, ResyncInterval time.Duration
	MaxConcurrentReplays          int
	// Rates are the levels' publish rates, in batches per second over the fleet.
	// Required.
	Rates []float64
	// Duration is each level's publishing time. Default 10s.
	Duration time.Duration
	// Warmup fills every engine's cache before the first level, at WarmupRate
	// (default the first level's rate) for at most WarmupMax (default 2m), so that
	// the levels run with evictions, as a serving fleet does. Default on; NoWarmup
	// turns it off.
	NoWarmup   bool
	WarmupRate float64
	WarmupMax  time.Duration
	// Drain bounds the wait, after a level stops publishing, for serve to have applied
	// everything. Default 30s.
	Drain time.Duration
	// QueryRate is the match queries per second during a level, over APIs in turn,
	// by at most QueryClients clients at once. Defaults 200, [http grpc], 8.
	QueryRate    float64
	NoQueries    bool
	APIs         []string
	QueryClients int
	// QueryCommand starts the query child (querychild.go): the match clients run in
	// that process, started before LoadgenNice applies, so at serve's priority. The
	// command is a binary that runs QueryChild when IsQueryChild (kvindex's loadtest
	// does). Empty: the clients run in this process.
	QueryCommand []string
	// ProbeRate is the apply-lag probes per second; ProbePoll how often a probe polls.
	// Defaults 20 and 1ms.
	ProbeRate float64
	ProbePoll time.Duration
	// MaxLag is the apply-lag p99 a level may have to count as held (not judged on
	// a level with a Stall, nor on the warm-up). Default 1s.
	MaxLag time.Duration
	// Stall, when set, stops the fleet's PUB writes for this long in the middle of
	// each level (fakevllm.Fleet.Stall): queues fill and drop, and the gaps must be recovered
	// by replay. StallServer instead stops the serve process (SIGSTOP, exec mode).
	Stall       time.Duration
	StallServer bool
	// KeepGoing runs every level even after one fails (default: stop at the first).
	KeepGoing bool
	// LoadgenNice, with an exec serve, is added to this process's nice value once serve
	// has started, so that the generator (engines, queries, probes) yields the cores
	// to serve (Linux; 0: same priority).
	LoadgenNice int
	// ServeCPUProfile, with an exec serve, is a file the serve child writes a CPU
	// profile of its whole run to (the binary's KVINDEX_CPUPROFILE).
	ServeCPUProfile string
	// Log receives progress lines. Default: discard.
	Log io.Writer
}

func (c Config) withDefaults() Config {
	if c.Server == "" {
		c.Server = ServerInproc
		if len(c.ServeCommand) > 0 {
			c.Server = ServerExec
		}
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.WarmupRate == 0 && len(c.Rates) > 0 {
		c.WarmupRate = c.Rates[0]
	}
	if c.WarmupMax == 0 {
		c.WarmupMax = 2 * time.Minute
	}
	if c.Drain == 0 {
		c.Drain = 30 * time.Second
	}
	if c.QueryRate == 0 {
		c.QueryRate = 200
	}
	if c.NoQueries {
		c.QueryRate = 0
	}
	if len(c.APIs) == 0 {
		c.APIs = []string{APIHTTP, APIGRPC}
	}
	if c.QueryClients == 0 {
		c.QueryClients = 8
	}
	if c.ProbeRate == 0 {
		c.ProbeRate = 20
	}
	if c.ProbePoll == 0 {
		c.ProbePoll = time.Millisecond
	}
	if c.MaxLag == 0 {
		c.MaxLag = time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Validate checks the configuration (with its defaults) as Run would.
func (c Config) Validate() error {
	c = c.withDefaults()
	c.Fleet = c.Fleet.WithDefaults()
	if err := c.Fleet.Validate(); err != nil {
		return err
	}
	return c.validate()
}

func (c Config) validate() error {
	switch {
	case c.Server != ServerInproc && c.Server != ServerExec:
		return fmt.Errorf("fleet: server %q (want %s or %s)", c.Server, ServerInproc, ServerExec)
	case c.Server == ServerExec && len(c.ServeCommand) == 0:
		return errors.New("fleet: exec server without a serve command")
	case len(c.Rates) == 0:
		return errors.New("fleet: no rates")
	case c.Duration < 0 || c.Drain < 0 || c.Stall < 0 || c.WarmupMax < 0:
		return errors.New("fleet: negative duration")
	case c.LoadgenNice < 0 || c.LoadgenNice > 19:
		return fmt.Errorf("fleet: loadgen nice %d (want 0..19)", c.LoadgenNice)
	case c.Stall >= c.Duration:
		return fmt.Errorf("fleet: stall %v must be shorter than the level (%v)", c.Stall, c.Duration)
	case c.StallServer && c.Server != ServerExec:
		return errors.New("fleet: stalling the server needs the exec server")
	case c.StallServer && stopSignal == nil:
		return errors.New("fleet: stalling the server needs SIGSTOP and SIGCONT (Unix)")
	case c.QueryClients < 1 || c.QueryClients > 1024:
		return fmt.Errorf("fleet: %d query clients (want 1..1024)", c.QueryClients)
	}
	for _, r := range c.Rates {
		if !(r > 0 && r <= 1e7) {
			return fmt.Errorf("fleet: rate %v (want (0, 1e7] batches/s)", r)
		}
	}
	for _, a := range c.APIs {
		if a != APIHTTP && a != APIGRPC {
			return fmt.Errorf("fleet: API %q (want %s, %s)", a, APIHTTP, APIGRPC)
		}
	}
	return nil
}

// Level is one level's figures.
type Level struct {
	Engines int
	// Offered is the configured rate; Published the batches the fleet published and
	// PublishRate their rate (below Offered when the load generator fell behind).
	Offered     float64
	Published   uint64
	PublishRate float64
	Seconds     float64
	// AppliedRate and BlocksRate are what serve applied while the fleet published:
	// batches, and blocks stored plus removed, per second.
	AppliedRate, BlocksRate float64
	// Loss: batches published and never applied once the drain is over.
	Loss uint64
	// Gaps the subscribers detected, recovered and could not recover; replays they
	// ran; replays the engines answered; live messages the engines' PUB queues
	// dropped at their high-water marks; workers not live; workers whose size
	// differs from their engine's own count, and the blocks they differ by.
	Gaps, Recovered, Unrecoverable uint64
	Replays, ReplaysServed         uint64
	// ReplayServeMax is the engines' longest replay service (DEALER connection
	// accepted to reply written): a slow one is the load generator's delay, not serve's.
	ReplayServeMax time.Duration
	Dropped        uint64
	Stale          int
	SizeMismatch   int
	BlocksOff      int64
	// Drained is how long serve took to apply everything after the fleet stopped.
	Drained time.Duration
	// Lag: publish to visible in a /v1/match answer; ProbesExpired: probes never seen.
	Lag           Latency
	ProbesExpired int
	// Match latency per API under the ingest, from each query's scheduled start, and
	// the queries that failed or were skipped (every client busy). MatchSent is the
	// same queries' latency from the moment their client sent them: without the load
	// generator's lateness in starting them.
	Match        map[string]Latency
	MatchSent    map[string]Latency
	MatchErrors  int
	MatchSkipped int64
	// Server's resources: peak RSS, file descriptors and OS threads while the level
	// ran, goroutines at its end, CPU used over the level's wall time (1.0 = a core).
	RSS        int64
	FDs        int
	Threads    int
	Goroutines int
	CPU        float64
	// The load generator's own CPU and RSS (exec mode; in-process the server's
	// figures include it).
	GenCPU float64
	GenRSS int64
	// ServeSched and ServeFind are serve's own p99s over the level (from its
	// /metrics; 0 where unread): the Go scheduler's wait of a runnable goroutine for a
	// P, and the index's find-matches call of /v1/match.
	ServeSched, ServeFind time.Duration
	// ServeMatch is serve's own match p99 over the level by API ("http", "grpc"): its
	// time in the match handler, as the upper bound of the histogram bucket (about
	// 1.57x wide) the p99 falls in; absent where unread.
	ServeMatch map[string]time.Duration
	// Load is the machine's load average when the level started.
	Load string
	// Held: no loss, nothing stale, no size differs, lag p99 within MaxLag, and the
	// fleet published at least 95% of the offered rate. Why says what failed.
	Held bool
	Why  []string
	// LastError is the last query or probe error, if any.
	LastError string
}

// Report is a whole run.
type Report struct {
	Config Config
	// Setup: time to start, connect and sync every engine.
	Setup   time.Duration
	Warmup  *Level
	Levels  []Level
	GoMax   int
	CPUs    int
	Server  string
	Workers int
}

// Best returns the highest offered rate held (0 when none).
func (r *Report) Best() float64 {
	best := 0.0
	for _, l := range r.Levels {
		if l.Held && l.Offered > best {
			best = l.Offered
		}
	}
	return best
}

// Run runs the load test.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	cfg.Fleet = cfg.Fleet.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ensureFDs(cfg); err != nil {
		return nil, err
	}
	logw := cfg.Log
	t0 := time.Now()
	f, err := fakevllm.NewFleet(cfg.Fleet)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scfg := serverConfig(f, &cfg)
	f.ReleasePorts()
	var tgt target
	if cfg.Server == ServerExec {
		tgt, err = startChild(cfg.ServeCommand, scfg, cfg.ServeCPUProfile, logw)
	} else {
		tgt, err = startInproc(scfg)
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if tgt != nil {
			_ = tgt.close()
		}
	}()
	var qp *queryProc
	if len(cfg.QueryCommand) > 0 && !cfg.NoQueries {
		// Started before the generator lowers its priority: the child keeps serve's.
		if qp, err = startQueryProc(cfg.QueryCommand, logw); err != nil {
			return nil, err
		}
		defer qp.close()
		if err := qp.setup(tgt.httpAddr(), tgt.grpcAddr(), cfg.QueryClients); err != nil {
			return nil, err
		}
	}
	if cfg.Server == ServerExec {
		if err := lowerPriority(cfg.LoadgenNice); err != nil {
			return nil, err
		}
	}
	f.Connect()
	hc := &http.Client{Timeout: 60 * time.Second}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err = waitReady(rctx, hc, tgt.httpAddr(), tgt)
	cancel()
	if err != nil {
		return nil, err
	}
	gc, err := dialGRPC(tgt.grpcAddr())
	if err != nil {
		return nil, err
	}
	defer gc.Close()
	r := &runner{cfg: cfg, f: f, t: tgt, hc: hc, gc: gc, qp: qp,
		hm: newHTTPMatcher(tgt.httpAddr(), cfg.QueryClients+8)}
	rep := &Report{Config: cfg, Setup: time.Since(t0), GoMax: runtime.GOMAXPROCS(0), CPUs: runtime.NumCPU(),
		Server: cfg.Server, Workers: cfg.Fleet.Engines}
	fmt.Fprintf(logw, "fleet: %d engines connected and synced in %v\n", cfg.Fleet.Engines, rep.Setup.Round(time.Millisecond))
	if !cfg.NoWarmup {
		w, err := r.level(ctx, cfg.WarmupRate, cfg.WarmupMax, true)
		if err != nil {
			return rep, err
		}
		rep.Warmup = &w
		fmt.Fprintf(logw, "fleet: warm-up: %s\n", w.line())
		if !w.Held && !cfg.KeepGoing {
			return rep, nil
		}
	}
	for _, rate := range cfg.Rates {
		l, err := r.level(ctx, rate, cfg.Duration, false)
		if err != nil {
			return rep, err
		}
		rep.Levels = append(rep.Levels, l)
		fmt.Fprintf(logw, "fleet: %s\n", l.line())
		if !l.Held && !cfg.KeepGoing {
			break
		}
	}
	err = tgt.close()
	tgt = nil
	return rep, err
}

// runner runs levels against one fleet and server.
type runner struct {
	cfg  Config
	f    *fakevllm.Fleet
	t    target
	hc   *http.Client
	gc   *client.Client
	hm   *httpMatcher
	base []fakevllm.EngineCounts // counts at the previous level's end
	seed uint64
	qp   *queryProc // the query child (Config.QueryCommand), or nil
}

// level runs one level: publish at rate for d while queries and probes run, then
// stop, drain and check.
func (r *runner) level(ctx context.Context, rate float64, d time.Duration, warmup bool) (Level, error) {
	cfg := r.cfg
	l := Level{Engines: r.f.Engines(), Offered: rate, Load: loadAverage(), Match: map[string]Latency{}, MatchSent: map[string]Latency{}}
	if r.base == nil {
		r.base = r.f.Counts()
	}
	before, err := fetchWorkers(ctx, r.hc, r.t.httpAddr())
	if err != nil {
		return l, err
	}
	matchers := map[string]matcher{APIHTTP: r.hm, APIGRPC: grpcMatcher{r.gc}}
	r.seed++
	q := newQueryLoad(r.f, cfg.APIs, matchers, cfg.QueryRate, cfg.QueryClients)
	pr := &prober{f: r.f, m: r.hm, rate: cfg.ProbeRate, poll: cfg.ProbePoll, timeout: 10 * time.Second}
	for len(r.f.Probes()) > 0 {
		<-r.f.Probes()
	}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	var qerr error
	go func() {
		defer wg.Done()
		if r.qp != nil {
			qerr = r.qp.runLevel(lctx, q, r.f, r.seed)
		} else {
			q.run(lctx, r.seed)
		}
	}()
	go func() { defer wg.Done(); pr.run(lctx) }()
	samp := &sampler{pid: r.t.pid()}
	go func() { defer wg.Done(); samp.run(lctx) }()
	stallDone := make(chan struct{})
	if cfg.Stall > 0 && !warmup {
		go func() {
			defer close(stallDone)
			r.stall(lctx, d)
		}()
	} else {
		close(stallDone)
	}
	h0, _ := scrapeHists(ctx, r.hc, r.t.httpAddr(), serveHists...)
	cpu0, _ := readProc(r.t.pid())
	gen0, _ := readProc(selfPID())
	r.f.TakeReplayTime()
	t0 := time.Now()
	res := r.f.Drive(ctx, rate, d, warmup)
	l.Seconds = res.Seconds
	<-stallDone
	atEnd, err := fetchWorkers(ctx, r.hc, r.t.httpAddr())
	if err != nil {
		stopLoad()
		wg.Wait()
		return l, err
	}
	cpu1, _ := readProc(r.t.pid())
	gen1, _ := readProc(selfPID())
	wall := time.Since(t0).Seconds()
	if h1, err := scrapeHists(ctx, r.hc, r.t.httpAddr(), serveHists...); err == nil && h0 != nil {
		l.ServeSched = h1[schedHist].quantileSince(h0[schedHist], 0.99)
		l.ServeFind = h1[findHist].quantileSince(h0[findHist], 0.99)
		l.ServeMatch = map[string]time.Duration{}
		for api, name := range map[string]string{"http": httpMatchHist, "grpc": grpcMatchHist} {
			if h1[name] != nil {
				l.ServeMatch[api] = h1[name].quantileSince(h0[name], 0.99)
			}
		}
	}
	stopLoad()
	wg.Wait()
	if qerr != nil {
		return l, qerr
	}
	if n, err := r.t.goroutines(ctx); err == nil {
		l.Goroutines = n
	}
	l.RSS, l.FDs, l.Threads = samp.maxRSS, samp.maxFDs, samp.maxThreads
	l.CPU = (cpu1.CPU - cpu0.CPU).Seconds() / wall
	if r.cfg.Server == ServerExec {
		l.GenCPU = (gen1.CPU - gen0.CPU).Seconds() / wall
		l.GenRSS = gen1.RSS
	}
	counts := r.f.Counts()
	var blocks uint64
	for i, c := range counts {
		b := r.base[i]
		l.Published += c.Batches - b.Batches
		blocks += c.Stored + c.Removed - b.Stored - b.Removed
		l.Dropped += c.Dropped - b.Dropped
		l.ReplaysServed += c.Replays - b.Replays
	}
	l.PublishRate = float64(l.Published) / l.Seconds
	var applied uint64
	for _, c := range counts {
		w := atEnd[c.Worker]
		applied += w.Batches - before[c.Worker].Batches
	}
	l.AppliedRate = float64(applied) / l.Seconds
	if l.Published > 0 {
		l.BlocksRate = float64(blocks) * float64(applied) / float64(l.Published) / l.Seconds
	}
	// Drain: every worker at its engine's last batch, with its engine's size.
	drainStart := time.Now()
	final, err := r.drain(ctx, counts)
	l.Drained = time.Since(drainStart)
	if err != nil {
		return l, err
	}
	r.check(&l, counts, before, final)
	l.ReplayServeMax = r.f.TakeReplayTime()
	l.Lag = summarize(pr.lags)
	l.ProbesExpired = pr.expired
	for api, d := range q.lat {
		l.Match[api] = summarize(d)
	}
	for api, d := range q.sent {
		l.MatchSent[api] = summarize(d)
	}
	for _, n := range q.errs {
		l.MatchErrors += n
	}
	l.MatchErrors += pr.errs
	l.MatchSkipped = q.skipped.Load()
	if q.lastErr != nil {
		l.LastError = q.lastErr.Error()
	} else if pr.lastErr != nil {
		l.LastError = pr.lastErr.Error()
	}
	r.judge(&l, warmup, res)
	r.base = counts
	if err := r.t.failed(); err != nil {
		return l, err
	}
	return l, nil
}

// stall stops the fleet's writes (or the server process) for cfg.Stall in the middle
// of the level.
func (r *runner) stall(ctx context.Context, d time.Duration) {
	wait := func(t time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(t):
			return true
		}
	}
	if !wait((d - r.cfg.Stall) / 2) {
		return
	}
	if r.cfg.StallServer {
		r.t.signal(stopSignal)
		wait(r.cfg.Stall)
		r.t.signal(contSignal)
		return
	}
	r.f.Stall()
	wait(r.cfg.Stall)
	r.f.Resume()
}

// drain polls /v1/workers until every worker has applied its engine's last batch and
// holds its engine's blocks, or cfg.Drain passes; it returns the last answer.
func (r *runner) drain(ctx context.Context, counts []fakevllm.EngineCounts) (map[string]workerState, error) {
	deadline := time.Now().Add(r.cfg.Drain)
	for {
		ws, err := fetchWorkers(ctx, r.hc, r.t.httpAddr())
		if err != nil {
			return nil, err
		}
		done := true
		for _, c := range counts {
			w := ws[c.Worker]
			if !caughtUp(w, c) {
				done = false
				break
			}
		}
		if done || time.Now().After(deadline) {
			return ws, nil
		}
		select {
		case <-ctx.Done():
			return ws, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func caughtUp(w workerState, c fakevllm.EngineCounts) bool {
	return c.Batches == 0 || (w.LastSeq != nil && *w.LastSeq+1 == c.Batches && w.Size != nil && *w.Size == c.Held)
}

// check fills the loss, gap and size figures from the drained answer.
func (r *runner) check(l *Level, counts []fakevllm.EngineCounts, before, final map[string]workerState) {
	for _, c := range counts {
		w, b := final[c.Worker], before[c.Worker]
		applied := uint64(0)
		if w.LastSeq != nil {
			applied = *w.LastSeq + 1
		}
		if applied < c.Batches {
			l.Loss += c.Batches - applied
		}
		l.Gaps += w.Gaps.Detected - b.Gaps.Detected
		l.Recovered += w.Gaps.Recovered - b.Gaps.Recovered
		l.Unrecoverable += w.Gaps.Unrecoverable - b.Gaps.Unrecoverable
		l.Replays += w.Replays - b.Replays
		if w.State != "live" {
			l.Stale++
		}
		size := 0
		if w.Size != nil {
			size = *w.Size
		}
		if size != c.Held {
			l.SizeMismatch++
			l.BlocksOff += int64(abs(size - c.Held))
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// judge decides whether the level held.
func (r *runner) judge(l *Level, warmup bool, res fakevllm.DriveResult) {
	why := func(format string, args ...any) { l.Why = append(l.Why, fmt.Sprintf(format, args...)) }
	if l.Loss > 0 {
		why("%d batches lost", l.Loss)
	}
	if l.Unrecoverable > 0 {
		why("%d unrecoverable gaps", l.Unrecoverable)
	}
	if l.Stale > 0 {
		why("%d workers not live", l.Stale)
	}
	if l.SizeMismatch > 0 {
		why("%d workers' sizes differ from their engines' (by %d blocks)", l.SizeMismatch, l.BlocksOff)
	}
	// A stalled level's lag is the stall's: it is reported, and only what is lost
	// decides.
	timed := !warmup && r.cfg.Stall == 0
	if timed && l.Lag.N > 0 && l.Lag.P99 > r.cfg.MaxLag {
		why("apply lag p99 %v over %v", l.Lag.P99.Round(time.Millisecond), r.cfg.MaxLag)
	}
	if timed && l.ProbesExpired > 0 {
		why("%d probes never visible", l.ProbesExpired)
	}
	if !warmup && l.PublishRate < 0.95*l.Offered {
		why("the load generator published %.0f/s of %.0f/s", l.PublishRate, l.Offered)
	}
	if warmup && !res.AllFull {
		why("caches not full after %v", r.cfg.WarmupMax)
	}
	l.Held = len(l.Why) == 0
}

// sampler records a process's peak RSS, fds and threads every second (listing 4,000
// descriptors is not free).
type sampler struct {
	pid                int
	maxRSS             int64
	maxFDs, maxThreads int
}

func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if st, err := readProc(s.pid); err == nil {
			s.maxRSS = max(s.maxRSS, st.RSS)
			s.maxFDs = max(s.maxFDs, st.FDs)
			s.maxThreads = max(s.maxThreads, st.Threads)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fdsNeeded estimates this process's file descriptors: per engine two listeners, a
// PUB connection and a replay connection at a time; in-process, the subscriber's SUB
// and DEALER ends too.
func fdsNeeded(cfg Config) int {
	n := 4*cfg.Fleet.Engines + 256
	if cfg.Server == ServerInproc {
		n += 2 * cfg.Fleet.Engines
	}
	return n
}
