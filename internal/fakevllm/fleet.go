package fakevllm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// FleetConfig configures the simulated engines. Zero fields take the defaults.
type FleetConfig struct {
	// Engines is the number of engines. Required, at most MaxEngines.
	Engines int
	// Workload shapes each engine's requests and cache.
	Workload Workload
	// BufferSteps is each engine's replay buffer, in batches (vLLM's buffer_steps,
	// 10,000 by default there). Default: vLLM's for up to 52 engines, then as many as
	// keep the fleet's buffers near 512 MiB of payloads (about 1 KiB a batch), at least
	// 256: 1,024 at 512 engines, 256 at 2,048.
	BufferSteps int
	// HWMBytes is each PUB connection's send queue in bytes: past it live messages
	// are dropped, as a PUB socket at its high-water mark drops them (vLLM's hwm is
	// 100,000 messages; a byte bound keeps the generator's memory bounded). Default:
	// 256 MiB over the fleet, between 1 and 16 MiB a connection.
	HWMBytes int
	// Encoding of the events: EncodingMap (vLLM v0.26.0, default) or EncodingArray.
	Encoding string
	// Drivers is the number of goroutines publishing (each owns Engines/Drivers
	// engines). Default GOMAXPROCS.
	Drivers int
	// Seed seeds the workload. Default 1.
	Seed uint64
	// Connect makes the engines' PUB sockets connect to serve, which binds one
	// endpoint per engine (vLLM connects when its endpoint names a host; serve's
	// engines have bind true), instead of binding them. The replay ROUTERs stay bound.
	Connect bool
}

// MaxEngines bounds FleetConfig.Engines.
const MaxEngines = 16384

// Model is the model name every simulated engine serves.
const Model = "fleet"

// WithDefaults returns c with its zero fields set to the defaults.
func (c FleetConfig) WithDefaults() FleetConfig {
	if c.Workload.SystemPrompts == 0 {
		c.Workload.SystemPrompts = max(32, c.Engines/4)
	}
	c.Workload = c.Workload.withDefaults()
	n := max(c.Engines, 1)
	if c.BufferSteps == 0 {
		c.BufferSteps = min(10000, max(256, (512<<10)/n))
	}
	if c.HWMBytes == 0 {
		c.HWMBytes = min(16<<20, max(1<<20, (256<<20)/n))
	}
	if c.Encoding == "" {
		c.Encoding = EncodingMap
	}
	if c.Drivers == 0 {
		c.Drivers = runtime.GOMAXPROCS(0)
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c
}

// Validate checks a configuration with its defaults applied (WithDefaults).
func (c FleetConfig) Validate() error {
	w := c.Workload
	switch {
	case c.Engines < 1 || c.Engines > MaxEngines:
		return fmt.Errorf("fakevllm: %d engines (want 1..%d)", c.Engines, MaxEngines)
	case c.BufferSteps < 1 || c.BufferSteps > 1<<20:
		return fmt.Errorf("fakevllm: buffer steps %d (want 1..%d)", c.BufferSteps, 1<<20)
	case c.HWMBytes < 4<<10:
		return fmt.Errorf("fakevllm: HWM %d bytes (want at least 4 KiB)", c.HWMBytes)
	case c.Encoding != EncodingMap && c.Encoding != EncodingArray:
		return fmt.Errorf("fakevllm: encoding %q (want %s or %s)", c.Encoding, EncodingMap, EncodingArray)
	case c.Drivers < 1 || c.Drivers > 256:
		return fmt.Errorf("fakevllm: %d drivers (want 1..256)", c.Drivers)
	case w.BlockSize < 1 || w.BlockSize > 256:
		return fmt.Errorf("fakevllm: block size %d (want 1..256)", w.BlockSize)
	case w.SystemPrompts < 1 || w.SystemBlocks < 1 || w.Sessions < 1 || w.TurnBlocks < 1 || w.OutputBlocks < 0:
		return errors.New("fakevllm: system prompts, system blocks, sessions and turn blocks must be at least 1")
	case w.MaxSessionBlocks <= w.SystemBlocks+w.OutputBlocks:
		return fmt.Errorf("fakevllm: max session blocks %d must exceed system blocks + output blocks (%d)", w.MaxSessionBlocks, w.SystemBlocks+w.OutputBlocks)
	case w.MaxSessionBlocks > 4096:
		return fmt.Errorf("fakevllm: max session blocks %d (at most 4096)", w.MaxSessionBlocks)
	case w.Capacity < w.MaxSessionBlocks || w.Capacity > 1<<22:
		return fmt.Errorf("fakevllm: capacity %d blocks (want max session blocks %d .. %d)", w.Capacity, w.MaxSessionBlocks, 1<<22)
	}
	return nil
}

// Fleet is the simulated engines and their drivers.
//
// Ownership: New starts one accept goroutine per listener and, per connection, the
// goroutines of engine.go; Drive runs the driver goroutines and returns when they are
// done; Close stops everything and waits. observe and the probe machinery are called
// from the drivers.
type Fleet struct {
	cfg      FleetConfig
	topic    []byte
	prompts  *prompts
	engines  []*simEngine
	gate     gate
	wg       sync.WaitGroup
	closing  atomic.Bool
	done     chan struct{} // closed by Close
	doneOnce sync.Once
	// placeholders hold the ports serve will bind for a connecting fleet; nextPort is
	// the next one to try (NewFleet only).
	placeholders []net.Listener
	nextPort     int

	connsMu sync.Mutex
	conns   map[net.Conn]struct{} // every accepted connection, closed by Close

	// replayCut, when > 0, is how many batches a replay reply carries before it
	// breaks off (SetReplayCut).
	replayCut atomic.Int64

	acceptErrors    atomic.Uint64
	handshakeErrors atomic.Uint64
	// replayTime is the longest replay service, from the DEALER's connection accepted
	// to the reply written (reset by each level).
	replayTime maxDuration

	// Probes: the prober asks for one (WantProbe), the next driver to publish takes
	// it and sends the batch's chain on probes.
	probeWanted atomic.Bool
	probes      chan Probe

	// Recent request chains, for query clients (recentMu).
	recentMu   sync.Mutex
	recent     [][]uint64
	recentNext int
}

// Probe is a published batch whose visibility a load test times.
type Probe struct {
	Worker  string
	Content []uint64 // the request's chain: visible when the worker matches all of it
	At      time.Time
}

// WantProbe asks (true) the next driver to publish for a Probe of its batch, or
// withdraws the request (false).
func (f *Fleet) WantProbe(want bool) { f.probeWanted.Store(want) }

// Probes delivers the probes asked for (capacity 64; one not taken in time is
// dropped).
func (f *Fleet) Probes() <-chan Probe { return f.probes }

// TakeReplayTime returns the longest replay service since the last call (from the
// DEALER's connection accepted to the reply written) and resets it.
func (f *Fleet) TakeReplayTime() time.Duration { return f.replayTime.take() }

// SetReplayCut makes every replay reply from now on break off after n batches, with
// no end marker, as vLLM's ROUTER does when it drops the replies past its high-water
// mark (a hostile engine, for tests); 0 answers whole replies again.
func (f *Fleet) SetReplayCut(n int) { f.replayCut.Store(int64(n)) }

// Config is the fleet's configuration with its defaults applied.
func (f *Fleet) Config() FleetConfig { return f.cfg }

// recentPrompts is the number of recent request chains kept for queries.
const recentPrompts = 4096

// NewFleet listens on two loopback ports per engine and starts accepting.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{
		cfg:     cfg,
		topic:   []byte{},
		prompts: newPrompts(cfg.Workload, cfg.Seed),
		conns:   map[net.Conn]struct{}{},
		probes:  make(chan Probe, 64),
		done:    make(chan struct{}),
	}
	f.gate.init()
	for i := range cfg.Engines {
		e := &simEngine{
			f:      f,
			id:     i,
			worker: WorkerName(i),
			pool:   newBlockPool(cfg.Workload.Capacity),
			req:    newRequester(f.prompts, mix64(cfg.Seed*0x1000193+uint64(i))),
			ring:   make([][]byte, cfg.BufferSteps),
		}
		if err := e.listen(cfg.Connect); err != nil {
			f.Close()
			return nil, fmt.Errorf("fakevllm: engine %d: %w (file descriptor limit? each engine needs about 4)", i, err)
		}
		f.engines = append(f.engines, e)
		f.wg.Add(1)
		go e.acceptLoop(e.repLn, f.tracked(e.serveReplay))
		if e.pubLn != nil {
			f.wg.Add(1)
			go e.acceptLoop(e.pubLn, f.tracked(e.servePub))
		}
	}
	return f, nil
}

// Connecting fleets take serve's ports from PortBase up, below the ephemeral range.
const (
	PortBase = 20000
	portTop  = 32767 // Linux's default ephemeral range starts at 32768
)

// reservePort listens on the next free port from PortBase (the caller holds it).
func (f *Fleet) reservePort() (net.Listener, error) {
	if f.nextPort == 0 {
		f.nextPort = PortBase
	}
	for ; f.nextPort <= portTop; f.nextPort++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", f.nextPort))
		if err == nil {
			f.nextPort++
			return l, nil
		}
	}
	return nil, fmt.Errorf("fakevllm: no free port left in %d..%d for serve to bind", PortBase, portTop)
}

// ReleasePorts frees the ports a connecting fleet reserved for serve to bind
// (FleetConfig.Connect); call it just before serve starts.
func (f *Fleet) ReleasePorts() {
	for _, l := range f.placeholders {
		l.Close()
	}
	f.placeholders = nil
}

// Connect starts a connecting fleet's PUB dialers (FleetConfig.Connect): call it once
// serve has its configuration (the endpoints), before or after it listens.
func (f *Fleet) Connect() {
	for _, e := range f.engines {
		if e.dialAddr != "" {
			f.wg.Add(1)
			go e.dialLoop()
		}
	}
}

// WorkerName is the worker id of engine i.
func WorkerName(i int) string { return fmt.Sprintf("e%04d", i) }

// tracked wraps a connection handler so that Close can close the connection.
func (f *Fleet) tracked(serve func(net.Conn)) func(net.Conn) {
	return func(c net.Conn) {
		f.connsMu.Lock()
		if f.closing.Load() {
			f.connsMu.Unlock()
			c.Close()
			return
		}
		f.conns[c] = struct{}{}
		f.connsMu.Unlock()
		defer func() {
			f.connsMu.Lock()
			delete(f.conns, c)
			f.connsMu.Unlock()
		}()
		serve(c)
	}
}

// Endpoints returns engine i's PUB and replay endpoints.
func (f *Fleet) Endpoints(i int) (pub, replay string) {
	e := f.engines[i]
	return e.endpoint(), e.replayEndpoint()
}

// Engines returns the number of engines.
func (f *Fleet) Engines() int { return len(f.engines) }

// Close closes every listener and connection and waits for the fleet's goroutines.
// Drive must have returned.
func (f *Fleet) Close() {
	f.closing.Store(true)
	f.doneOnce.Do(func() { close(f.done) })
	f.ReleasePorts()
	f.gate.resume()
	for _, e := range f.engines {
		if e.pubLn != nil {
			e.pubLn.Close()
		}
		e.repLn.Close()
	}
	f.connsMu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.connsMu.Unlock()
	for _, e := range f.engines {
		e.closeConns()
	}
	f.wg.Wait()
}

// Stall stops every PUB connection's writes until Resume: the queues fill to their
// high-water marks and drop, as an engine's PUB does when its subscriber stops
// reading; Resume then sends what was queued and the gaps are recovered by replay.
func (f *Fleet) Stall()  { f.gate.stall() }
func (f *Fleet) Resume() { f.gate.resume() }

// maxDuration is a running maximum, safe for concurrent use.
type maxDuration struct{ v atomic.Int64 }

func (m *maxDuration) observe(d time.Duration) {
	for {
		cur := m.v.Load()
		if int64(d) <= cur || m.v.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (m *maxDuration) take() time.Duration { return time.Duration(m.v.Swap(0)) }

// gate is open (wait returns a closed channel) unless stalled.
type gate struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *gate) init() {
	g.ch = make(chan struct{})
	close(g.ch)
}

func (g *gate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ch
}

func (g *gate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.ch:
		g.ch = make(chan struct{})
	default:
	}
}

func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.ch:
	default:
		close(g.ch)
	}
}

// DriveResult is what one Drive published.
type DriveResult struct {
	Batches  uint64
	Seconds  float64
	Behind   time.Duration // how far the slowest driver fell behind its schedule at the end
	AllFull  bool          // every engine's cache was full (after a warm-up)
	Finished time.Time
}

// Drive publishes batches at rate (per second, over the whole fleet, spread evenly:
// each engine publishes rate/Engines batches a second, at evenly spaced times) until
// ctx ends or d has passed. With untilFull it also stops once every engine's cache is
// full. Drive must not run twice at once.
func (f *Fleet) Drive(ctx context.Context, rate float64, d time.Duration, untilFull bool) DriveResult {
	start := time.Now()
	deadline := start.Add(d)
	n := f.cfg.Drivers
	var wg sync.WaitGroup
	var total atomic.Uint64
	behind := make([]time.Duration, n)
	full := make([]bool, n)
	for g := range n {
		var owned []*simEngine
		for i := g; i < len(f.engines); i += n {
			owned = append(owned, f.engines[i])
		}
		if len(owned) == 0 {
			full[g] = true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rate * float64(len(owned)) / float64(len(f.engines))
			sent, late, isFull := f.drive(ctx, owned, r, start, deadline, untilFull)
			total.Add(sent)
			behind[g], full[g] = late, isFull
		}()
	}
	wg.Wait()
	res := DriveResult{Batches: total.Load(), Seconds: time.Since(start).Seconds(), Behind: slices.Max(behind),
		AllFull: !slices.Contains(full, false), Finished: time.Now()}
	return res
}

// DriveInBackground publishes at rate (as Drive) on a goroutine of its own until ctx
// ends or stop is called; stop ends the publishing and returns once it has stopped, so
// that Counts and another Drive may follow (`kvindex demo` publishes this way for as
// long as it runs). stop may be called more than once. It counts as a Drive: none may
// run beside it.
func (f *Fleet) DriveInBackground(ctx context.Context, rate float64) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			f.Drive(ctx, rate, time.Hour, false)
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// drive is one driver goroutine: it publishes to owned in turn at rate batches/s. It
// sleeps while ahead of its schedule and, when behind, publishes without sleeping.
func (f *Fleet) drive(ctx context.Context, owned []*simEngine, rate float64, start, deadline time.Time, untilFull bool) (sent uint64, behind time.Duration, full bool) {
	next := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	fullAt := make([]bool, len(owned))
	nfull := 0
	for {
		now := time.Now()
		if now.After(deadline) || ctx.Err() != nil {
			break
		}
		due := uint64(now.Sub(start).Seconds() * rate)
		if due <= sent {
			wait := time.Duration(float64(sent+1)/rate*1e9) - now.Sub(start)
			timer.Reset(max(wait, 200*time.Microsecond))
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
			continue
		}
		for ; sent < due && ctx.Err() == nil; sent++ {
			e := owned[next]
			e.publish(now)
			if untilFull && !fullAt[next] && e.pool.len()+f.cfg.Workload.MaxSessionBlocks > e.pool.capacity {
				fullAt[next] = true
				nfull++
			}
			next = (next + 1) % len(owned)
			if sent%64 == 63 {
				now = time.Now()
			}
		}
		if untilFull && nfull == len(owned) {
			return sent, 0, true
		}
	}
	behind = max(0, time.Since(start)-time.Duration(float64(sent)/rate*1e9))
	return sent, behind, nfull == len(owned)
}

// observe is called by a driver after each batch: it keeps a sample of request chains
// for the query clients and hands a probe to the prober when one is wanted.
func (f *Fleet) observe(e *simEngine, c *chain, now time.Time) {
	if f.probeWanted.Load() && f.probeWanted.CompareAndSwap(true, false) {
		select {
		case f.probes <- Probe{Worker: e.worker, Content: slices.Clone(c.content), At: now}:
		default:
		}
	}
	if e.sinceSamp++; e.sinceSamp < 4 {
		return
	}
	e.sinceSamp = 0
	f.recentMu.Lock()
	if len(f.recent) < recentPrompts {
		f.recent = append(f.recent, slices.Clone(c.content))
	} else {
		f.recent[f.recentNext] = append(f.recent[f.recentNext][:0], c.content...)
		f.recentNext = (f.recentNext + 1) % recentPrompts
	}
	f.recentMu.Unlock()
}

// SamplePrompt copies a random recent request chain into dst (false when none yet).
func (f *Fleet) SamplePrompt(rng *rand.Rand, dst []uint64) ([]uint64, bool) {
	f.recentMu.Lock()
	defer f.recentMu.Unlock()
	return SampleFrom(f.recent, rng, dst)
}

// SampleFrom copies a random one of chains into dst (false when there is none): what
// SamplePrompt does with the fleet's recent chains, for a copy of them kept elsewhere
// (the load test's query child).
func SampleFrom(chains [][]uint64, rng *rand.Rand, dst []uint64) ([]uint64, bool) {
	if len(chains) == 0 {
		return dst, false
	}
	return append(dst[:0], chains[rng.IntN(len(chains))]...), true
}

// EngineCounts is one engine's own account of what it published.
type EngineCounts struct {
	Worker           string
	Batches          uint64 // batches published (the next sequence)
	Stored, Removed  uint64 // blocks in them
	Held             int    // blocks its cache holds now
	Dropped          uint64 // live messages dropped at the high-water mark
	Replays, Replied uint64 // replay requests answered, batches sent in replies
}

// Counts returns every engine's counts (call between Drives).
func (f *Fleet) Counts() []EngineCounts {
	out := make([]EngineCounts, len(f.engines))
	for i, e := range f.engines {
		b, s, r, h := e.counts()
		out[i] = EngineCounts{Worker: e.worker, Batches: b, Stored: s, Removed: r, Held: h,
			Dropped: e.dropped.Load(), Replays: e.replays.Load(), Replied: e.replayed.Load()}
	}
	return out
}
