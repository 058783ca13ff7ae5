package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Peer is a replay driver of another project's index: a binary of bench/peers (built by
// `make bench-peers`, never by CI) that reads an op log, runs the measurements of Run on
// it and prints them as one JSON object (see bench/peers/driver).
type Peer struct {
	// Name is the name the table shows ("smg-positional", "smg-chain").
	Name string
	// Path is the binary.
	Path string
}

// PeerNames are the drivers FindPeers looks for, in table order.
var PeerNames = []string{"smg-chain", "smg-positional"}

// FindPeers returns the drivers of PeerNames present (as executable files) in dir, and
// the names it did not find.
func FindPeers(dir string) (found []Peer, missing []string) {
	for _, n := range PeerNames {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			found = append(found, Peer{Name: n, Path: p})
		} else {
			missing = append(missing, n)
		}
	}
	return found, missing
}

// maxPeerOutput bounds what is read of a driver's stdout and stderr: its result is a few
// hundred bytes, so anything near this is a broken driver, not a result.
const maxPeerOutput = 1 << 20

// peerJSON is a driver's output (bench/peers/driver/src/run.rs).
type peerJSON struct {
	Impl     string `json:"impl"`
	Events   int    `json:"events"`
	BlockOps int64  `json:"block_ops"`
	Rejected int    `json:"rejected"`
	Verify   struct {
		Ran    bool   `json:"ran"`
		Passed int    `json:"passed"`
		Failed int    `json:"failed"`
		Scores int    `json:"scores_passed"`
		First  string `json:"first"`
	} `json:"verify"`
	Replay          peerReplay `json:"replay"`
	ReplayCoalesced peerReplay `json:"replay_coalesced"`
	VerifyCoalesced struct {
		Ran    bool   `json:"ran"`
		Passed int    `json:"passed"`
		Failed int    `json:"failed"`
		First  string `json:"first"`
	} `json:"verify_coalesced"`
	Rest   peerQueries `json:"rest"`
	Load   peerQueries `json:"load"`
	Memory struct {
		Memberships        int64   `json:"memberships"`
		AllocBytes         int64   `json:"alloc_bytes"`
		AllocPerMembership float64 `json:"alloc_bytes_per_membership"`
		RSSBytes           int64   `json:"rss_bytes"`
		RSSPerMembership   float64 `json:"rss_bytes_per_membership"`
	} `json:"memory"`
}

// peerReplay is a driver's events measurement; CPUSeconds is the process CPU time of
// the median pass (0 from a driver that does not report it).
type peerReplay struct {
	Events         int     `json:"events"`
	Passes         int     `json:"passes"`
	Seconds        float64 `json:"seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	BlockOpsPerSec float64 `json:"block_ops_per_sec"`
	EventsPerSec   float64 `json:"events_per_sec"`
}

// result is r as an EventResult of a replay of events events and blockOps block ops.
func (r peerReplay) result(events int, blockOps int64, rejected int) EventResult {
	e := EventResult{Producers: 1, Passes: r.Passes, Seconds: r.Seconds, Events: events,
		BlockOps: blockOps, EventsPerSec: r.EventsPerSec, BlockOpsPerSec: r.BlockOpsPerSec,
		CPUSeconds: r.CPUSeconds, AllocsPerEvent: -1, Rejected: rejected}
	if r.Events > 0 {
		e.Events = r.Events
	}
	if r.CPUSeconds > 0 {
		e.CPUBlockOpsPerSec = float64(blockOps) / r.CPUSeconds
	}
	return e
}

type peerQueries struct {
	Queries      int     `json:"queries"`
	Seconds      float64 `json:"seconds"`
	P50          int64   `json:"p50_ns"`
	P99          int64   `json:"p99_ns"`
	P999         int64   `json:"p999_ns"`
	Events       int64   `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	Loops        int     `json:"loops"`
}

func (q peerQueries) result(queriers int) QueryResult {
	r := QueryResult{Queriers: queriers, Queries: q.Queries, Seconds: q.Seconds, P50: q.P50, P99: q.P99, P999: q.P999,
		AllocsPerQuery: -1, RoundsPerQuery: -1, ProbesPerQuery: -1, Events: q.Events, EventsPerSec: q.EventsPerSec, Loops: q.Loops}
	if q.Seconds > 0 {
		r.QueriesPerSec = float64(q.Queries) / q.Seconds
	}
	return r
}

// RunPeer runs the driver on the op log at opsPath with opt's budgets (one producer:
// the drivers replay on one thread) and returns its measurements as a Result. The
// driver's verification runs unless opt.SkipVerify. jump is the jump size passed to the
// driver's index.
func RunPeer(ctx context.Context, p Peer, opsPath string, jump int, opt Options) (Result, error) {
	opt = opt.withDefaults()
	args := []string{"--ops", opsPath, "--jump", strconv.Itoa(jump),
		"--duration-ms", strconv.FormatInt(max(1, opt.Duration.Milliseconds()), 10),
		"--queriers", strconv.Itoa(opt.Queriers), "--max-passes", strconv.Itoa(opt.MaxPasses),
		"--max-loops", strconv.Itoa(opt.MaxLoops), "--coalesce"}
	if opt.SkipVerify {
		args = append(args, "--no-verify")
	}
	cmd := exec.CommandContext(ctx, p.Path, args...)
	var stdout, stderr limitedBuffer
	stdout.limit, stderr.limit = maxPeerOutput, maxPeerOutput
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Result{Impl: p.Name}, fmt.Errorf("peer %s: %w: %s", p.Name, err, strings.TrimSpace(stderr.String()))
	}
	if stdout.over {
		return Result{Impl: p.Name}, fmt.Errorf("peer %s: output over %d bytes", p.Name, maxPeerOutput)
	}
	return decodePeer(p.Name, stdout.Bytes(), opt)
}

// decodePeer turns a driver's JSON output into a Result.
func decodePeer(name string, out []byte, opt Options) (Result, error) {
	res := Result{Impl: name}
	var j peerJSON
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&j); err != nil {
		return res, fmt.Errorf("peer %s: bad output: %w", name, err)
	}
	if j.Replay.Passes < 1 || j.Replay.Seconds <= 0 {
		return res, fmt.Errorf("peer %s: bad output: no replay pass", name)
	}
	if j.Verify.Ran {
		res.Verify = VerifyResult{Passed: j.Verify.Passed, Failed: j.Verify.Failed, First: j.Verify.First, ScoresPassed: j.Verify.Scores}
	}
	res.Events = []EventResult{j.Replay.result(j.Events, j.BlockOps, j.Rejected)}
	if j.ReplayCoalesced.Passes > 0 {
		res.Coalesced = j.ReplayCoalesced.result(0, j.BlockOps, 0)
		if v := j.VerifyCoalesced; v.Ran {
			res.CoalescedVerify = VerifyResult{Passed: v.Passed, Failed: v.Failed, First: v.First}
		}
	}
	res.Load = j.Load.result(opt.Queriers)
	res.Rest = j.Rest.result(1)
	res.Memory = MemoryResult{Memberships: j.Memory.Memberships, HeapBytes: j.Memory.AllocBytes,
		BytesPerMembership: j.Memory.AllocPerMembership, Method: MemoryAllocator,
		RSSBytesPerMembership: j.Memory.RSSPerMembership}
	return res, nil
}

// limitedBuffer keeps the first limit bytes written to it and notes whether there were
// more. It has no ReadFrom (a bytes.Buffer embedded would lend it one, and io.Copy would
// bypass the limit).
type limitedBuffer struct {
	buf   bytes.Buffer
	limit int
	over  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); len(p) > room {
		b.over = true
		b.buf.Write(p[:max(0, room)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *limitedBuffer) String() string { return b.buf.String() }

// Summary is one row of the peer table: every round's Result of one implementation.
type Summary struct {
	Impl   string
	Rounds []Result
}

// CompareRounds measures every Go implementation (with Run, one producer) and every peer
// (with RunPeer) once per round, in the same order each round, so that the machine's
// drift over the run reaches all of them alike. Verification runs in the first round
// only (it is deterministic). progress, when not nil, gets a line per measurement.
func CompareRounds(ctx context.Context, w *Workload, opsPath string, jump int, impls []Impl, peers []Peer, opt Options, rounds int, progress io.Writer) ([]Summary, error) {
	if rounds < 1 {
		return nil, errors.New("bench: rounds must be >= 1")
	}
	opt = opt.withDefaults()
	opt.Producers = []int{1}
	wc := w.Coalesced()
	sums := make([]Summary, len(impls)+len(peers))
	for round := range rounds {
		o := opt
		o.SkipVerify = opt.SkipVerify || round > 0
		for i := range sums {
			start := time.Now()
			var r Result
			var err error
			if i < len(impls) {
				r, err = runBoth(impls[i], w, wc, o)
			} else {
				r, err = RunPeer(ctx, peers[i-len(impls)], opsPath, jump, o)
			}
			if err != nil {
				return nil, err
			}
			if progress != nil {
				fmt.Fprintf(progress, "kvindex bench: round %d/%d: %s done in %.1f s\n", round+1, rounds, r.Impl, time.Since(start).Seconds())
			}
			sums[i].Impl = r.Impl
			sums[i].Rounds = append(sums[i].Rounds, r)
		}
	}
	return sums, nil
}

// runBoth is Run on w, then the events measurement and (unless opt.SkipVerify) the
// verification on wc, w's Coalesced form.
func runBoth(impl Impl, w, wc *Workload, opt Options) (Result, error) {
	r, err := Run(impl, w, opt)
	if err != nil {
		return r, err
	}
	if !opt.SkipVerify {
		if r.CoalescedVerify, err = Verify(impl, wc); err != nil {
			return r, err
		}
	}
	r.Coalesced, err = MeasureEvents(impl, wc, 1, opt.Duration, opt.MaxPasses)
	return r, err
}

// Failed reports whether the summary's verification found a wrong answer.
func (s Summary) Failed() bool {
	return len(s.Rounds) > 0 && (s.Rounds[0].Verify.Failed > 0 || s.Rounds[0].CoalescedVerify.Failed > 0)
}

// medianOf returns the median of f over the rounds (the mean of the middle two for an
// even count).
func medianOf(rs []Result, f func(Result) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return median(xs)
}

// WritePeerTable writes the peer table: one row per summary with the medians over its
// rounds, then the first mismatch of any implementation that gave a wrong answer.
func WritePeerTable(out io.Writer, h Header, sums []Summary, rounds int, markdown bool) error {
	opt := h.Options.withDefaults()
	w := h.Workload
	var b strings.Builder
	if markdown {
		fmt.Fprintf(&b, "### %s\n\n`%s`\n\n", w.Name, h.Command)
	} else {
		fmt.Fprintf(&b, "%s: %s\n\n", w.Name, h.Command)
	}
	bullet := "- "
	if !markdown {
		bullet = "  "
	}
	fmt.Fprintf(&b, "%s%s events (%s block ops), %s queries, %d workers; %d checked queries\n", bullet,
		Thousands(int64(len(w.Events))), Thousands(w.BlockOps), Thousands(int64(len(w.Queries))), len(w.Workers), w.Checked)
	fmt.Fprintf(&b, "%smedians of %d alternating rounds; %v per measurement; under events: 1 streamer + %d queriers\n\n", bullet, rounds, opt.Duration, opt.Queriers)
	hdr := []string{"impl", "block ops/s", "p50 at rest", "p99 at rest", "p50 under events", "p99 under events", "bytes/membership", "answers passed"}
	var rows [][]string
	for _, s := range sums {
		rows = append(rows, peerRow(s, w.Checked == 0 && !opt.SkipVerify))
	}
	section(&b, markdown, "Peers and kvindex, same run", hdr, rows)
	b.WriteString("Block ops/s: every event on a fresh index, one thread in log order, one call per event, median pass; " +
		"block ops are stored blocks and removed seqs (kvindex replay also counts query blocks). " +
		"At rest: 1 querier on the index a full pass left. Under events: 1 streamer looping over the events " +
		"while the queriers query. Bytes per membership: heap = live Go heap growth after GC over one pass; " +
		"alloc = live bytes counted by the Rust driver's global allocator over one pass, RSS = resident-set " +
		"growth over the empty index (first thing the driver process does); divided by the sum of the " +
		"workers' sizes at the end. Answers passed: queries whose answer (every worker's score and size) equals the " +
		"op log's expected answer; for a peer that fails some, \"scores\" counts those whose scores alone are right.\n\n")
	writeReplayTables(&b, sums, markdown)
	for _, s := range sums {
		if !s.Failed() {
			continue
		}
		if v := s.Rounds[0].Verify; v.Failed > 0 {
			fmt.Fprintf(&b, "%s: first mismatch: %s\n\n", s.Impl, v.First)
		}
		if v := s.Rounds[0].CoalescedVerify; v.Failed > 0 {
			fmt.Fprintf(&b, "%s, coalesced: first mismatch: %s\n\n", s.Impl, v.First)
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// ratioPeer is the peer the like-for-like ratios divide by.
const ratioPeer = "smg-chain"

// writeReplayTables writes the replays of every summary one call per event and
// coalesced (Workload.Coalesced), in wall and CPU time, and, when ratioPeer is among
// them, each implementation's ratios to it: per event to per event, coalesced to
// coalesced, each the median over the rounds of the round's ratio.
func writeReplayTables(b *strings.Builder, sums []Summary, markdown bool) {
	hdr := []string{"impl", "per event: block ops/s", "per event: CPU", "coalesced: block ops/s", "coalesced: CPU", "coalesced answers"}
	var rows [][]string
	var peer *Summary
	for i, s := range sums {
		if s.Impl == ratioPeer {
			peer = &sums[i]
		}
		med := func(f func(Result) float64) string { return rate(medianOf(s.Rounds, f)) }
		passed := "skipped"
		if v := s.Rounds[0].CoalescedVerify; v.Passed+v.Failed > 0 {
			passed = fmt.Sprintf("%d/%d", v.Passed, v.Passed+v.Failed)
		}
		rows = append(rows, []string{s.Impl,
			med(func(r Result) float64 { return eventsOf(r).BlockOpsPerSec }),
			med(func(r Result) float64 { return eventsOf(r).CPUBlockOpsPerSec }),
			med(func(r Result) float64 { return r.Coalesced.BlockOpsPerSec }),
			med(func(r Result) float64 { return r.Coalesced.CPUBlockOpsPerSec }), passed})
	}
	section(b, markdown, "Replays, one call per event and coalesced", hdr, rows)
	b.WriteString("Block ops per second of wall time and of process CPU time (every thread's, user and system: " +
		"a sharded engine's shard goroutines and the garbage collector count, and other jobs on the machine " +
		"do not), median pass, median of the rounds. Coalesced: the same log with consecutive removals of one " +
		"worker merged into one call and a store that extends the one before it merged into it (never across a " +
		"query), the same calls on both sides; answers: its checked queries that passed.\n\n")
	if peer == nil {
		return
	}
	hdr = []string{"impl", "per event (CPU)", "coalesced (CPU)", "per event (wall)", "coalesced (wall)", "p50 at rest", "bytes/membership"}
	rows = rows[:0]
	for _, s := range sums {
		if s.Impl == ratioPeer {
			continue
		}
		ratio := func(f func(Result) float64) string {
			var xs []float64
			for k := range min(len(s.Rounds), len(peer.Rounds)) {
				if d := f(peer.Rounds[k]); d > 0 && f(s.Rounds[k]) > 0 {
					xs = append(xs, f(s.Rounds[k])/d)
				}
			}
			if len(xs) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", median(xs))
		}
		rows = append(rows, []string{s.Impl,
			ratio(func(r Result) float64 { return eventsOf(r).CPUBlockOpsPerSec }),
			ratio(func(r Result) float64 { return r.Coalesced.CPUBlockOpsPerSec }),
			ratio(func(r Result) float64 { return eventsOf(r).BlockOpsPerSec }),
			ratio(func(r Result) float64 { return r.Coalesced.BlockOpsPerSec }),
			ratio(func(r Result) float64 { return float64(r.Rest.P50) }),
			ratio(residentPerMembership)})
	}
	section(b, markdown, "Like for like: over "+ratioPeer+"'s", hdr, rows)
	b.WriteString("Each cell: the median over the rounds of the round's ratio to " + ratioPeer + "'s figure of the same round. " +
		"Block ops/s per event to per event and coalesced to coalesced (above 1: faster than " + ratioPeer + "); " +
		"find-matches p50 at rest (below 1: faster); bytes per membership, heap for a Go row and RSS for a peer, " +
		"over " + ratioPeer + "'s RSS (below 1: smaller).\n\n")
}

// residentPerMembership is what r's index keeps per membership, as the ratio table compares
// it: the Go heap's growth for a Go implementation, the resident-set growth for a peer (whose
// allocator count includes reserved arena chunks nothing has touched).
func residentPerMembership(r Result) float64 {
	if r.Memory.Method == MemoryAllocator {
		return r.Memory.RSSBytesPerMembership
	}
	return r.Memory.BytesPerMembership
}

// eventsOf is r's one-producer events measurement (zero if it has none).
func eventsOf(r Result) EventResult {
	if len(r.Events) == 0 {
		return EventResult{}
	}
	return r.Events[0]
}

// peerRow is one summary's row of the peer table: medians over its rounds, and its first
// round's verification (verified says whether a log without checked queries still counts
// as verified, 0/0).
func peerRow(s Summary, verified bool) []string {
	rs := s.Rounds
	median := func(f func(Result) float64) float64 { return medianOf(rs, f) }
	ns := func(f func(Result) int64) string {
		return dur(int64(median(func(r Result) float64 { return float64(f(r)) })))
	}
	ops := median(func(r Result) float64 { return eventsOf(r).BlockOpsPerSec })
	bpm := median(func(r Result) float64 { return r.Memory.BytesPerMembership })
	mem := fmt.Sprintf("%.0f (heap)", bpm)
	if len(rs) > 0 && rs[0].Memory.Method == MemoryAllocator {
		mem = fmt.Sprintf("%.0f (alloc; RSS %.0f)", bpm, median(func(r Result) float64 { return r.Memory.RSSBytesPerMembership }))
	}
	passed := "skipped"
	if len(rs) > 0 && (rs[0].Verify.Passed+rs[0].Verify.Failed > 0 || verified) {
		v := rs[0].Verify
		passed = fmt.Sprintf("%d/%d", v.Passed, v.Passed+v.Failed)
		if v.ScoresPassed > v.Passed {
			passed += fmt.Sprintf(" (scores %d)", v.ScoresPassed)
		}
	}
	return []string{s.Impl, rate(ops),
		ns(func(r Result) int64 { return r.Rest.P50 }), ns(func(r Result) int64 { return r.Rest.P99 }),
		ns(func(r Result) int64 { return r.Load.P50 }), ns(func(r Result) int64 { return r.Load.P99 }),
		mem, passed}
}
