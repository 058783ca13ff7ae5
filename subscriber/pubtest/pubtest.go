package pubtest

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/oplog"
)

// CommandTimeout bounds the wait for the publisher's answer to one command.
const CommandTimeout = 15 * time.Second

var (
	pyOnce sync.Once
	pyPath string
	pyErr  error
)

// Python returns an interpreter that can import zmq and msgpack: $KVINDEX_PYTHON,
// python3 on PATH, or /usr/bin/python3 (Debian's, which a pyenv or venv python3 earlier
// on PATH would hide).
func Python() (string, error) {
	pyOnce.Do(func() {
		cands := []string{"python3", "/usr/bin/python3"}
		if p := os.Getenv("KVINDEX_PYTHON"); p != "" {
			cands = []string{p}
		}
		var errs []error
		for _, c := range cands {
			path, err := exec.LookPath(c)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := exec.CommandContext(ctx, path, "-c", "import zmq, msgpack").CombinedOutput()
			cancel()
			if err == nil {
				pyPath = path
				return
			}
			errs = append(errs, fmt.Errorf("%s: %v: %s", path, err, out))
		}
		pyErr = fmt.Errorf("pubtest: no python3 with zmq and msgpack (run testdata/publisher/install.sh): %w", errors.Join(errs...))
	})
	return pyPath, pyErr
}

// Require returns the interpreter, or skips the test (fails it when
// KVINDEX_REQUIRE_PUBLISHER=1).
func Require(t testing.TB) string {
	t.Helper()
	p, err := Python()
	if err != nil {
		if os.Getenv("KVINDEX_REQUIRE_PUBLISHER") == "1" {
			t.Fatalf("%v", err)
		}
		t.Skipf("SKIP (python publisher unavailable): %v", err)
	}
	return p
}

// Script returns the path of publisher.py: $KVINDEX_PUBLISHER, or
// testdata/publisher/publisher.py in this source tree.
func Script() string {
	if p := os.Getenv("KVINDEX_PUBLISHER"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "publisher", "publisher.py")
}

// Options are publisher.py's flags; zero values keep its defaults.
type Options struct {
	Endpoint         string // default tcp://127.0.0.1:0
	ReplayEndpoint   string // default tcp://127.0.0.1:0
	NoReplay         bool   // no replay endpoint
	Bind             bool   // bind the PUB whatever the endpoint
	Topic            string
	Ranks            int
	ConsecutivePorts bool
	BufferSteps      int
	Encoding         string // array, map, mixed (default)
	NoReplayTopic    bool   // reply [seq, payload] (vLLM < v0.26, SGLang)
	HashForm         string // int (default), bytes
	Extra            []string
}

func (o Options) args() []string {
	a := []string{}
	add := func(k, v string) { a = append(a, k, v) }
	if o.Endpoint != "" {
		add("--endpoint", o.Endpoint)
	}
	if o.NoReplay {
		add("--replay-endpoint", "")
	} else if o.ReplayEndpoint != "" {
		add("--replay-endpoint", o.ReplayEndpoint)
	}
	if o.Bind {
		a = append(a, "--bind")
	}
	if o.Topic != "" {
		add("--topic", o.Topic)
	}
	if o.Ranks > 0 {
		add("--dp-ranks", fmt.Sprint(o.Ranks))
	}
	if o.ConsecutivePorts {
		a = append(a, "--consecutive-ports")
	}
	if o.BufferSteps > 0 {
		add("--buffer-steps", fmt.Sprint(o.BufferSteps))
	}
	if o.Encoding != "" {
		add("--encoding", o.Encoding)
	}
	if o.NoReplayTopic {
		add("--replay-topic", "0")
	}
	if o.HashForm != "" {
		add("--hash-form", o.HashForm)
	}
	return append(a, o.Extra...)
}

// Rank is one rank's endpoints as the publisher reports them.
type Rank struct {
	Rank           int    `json:"rank"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
}

// Publisher is a running publisher.py.
type Publisher struct {
	Ranks []Rank

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	readWG sync.WaitGroup
	stderr *lockedBuffer

	mu     sync.Mutex
	closed bool
}

type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.b) < 1<<16 {
		l.b = append(l.b, p...)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// Start runs publisher.py with opts (control mode) and waits for its ready line.
func Start(opts Options) (*Publisher, error) {
	return StartArgs(opts.args())
}

// StartArgs runs publisher.py with raw arguments and waits for its ready line.
func StartArgs(args []string) (*Publisher, error) {
	py, err := Python()
	if err != nil {
		return nil, err
	}
	p := &Publisher{lines: make(chan []byte, 64), stderr: &lockedBuffer{}}
	p.cmd = exec.Command(py, append([]string{"-u", Script()}, args...)...)
	p.cmd.Stderr = p.stderr
	p.stdin, err = p.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	p.readWG.Add(1)
	go func() { // the stdout reader: ends at EOF, when the process exits
		defer p.readWG.Done()
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
		for sc.Scan() {
			p.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	var ready struct {
		Ready bool   `json:"ready"`
		Ranks []Rank `json:"ranks"`
	}
	if err := p.next(&ready); err != nil || !ready.Ready {
		p.Close()
		return nil, fmt.Errorf("pubtest: publisher did not start: %v; stderr: %s", err, p.stderr.String())
	}
	p.Ranks = ready.Ranks
	return p, nil
}

// next reads the next stdout line into v, waiting at most CommandTimeout.
func (p *Publisher) next(v any) error {
	t := time.NewTimer(CommandTimeout)
	defer t.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			return fmt.Errorf("pubtest: publisher exited; stderr: %s", p.stderr.String())
		}
		return json.Unmarshal(line, v)
	case <-t.C:
		return fmt.Errorf("pubtest: no answer within %v; stderr: %s", CommandTimeout, p.stderr.String())
	}
}

// Next reads the next line the publisher prints (trace mode's final line).
func (p *Publisher) Next(v any) error { return p.next(v) }

// Reply is the publisher's answer to a command.
type Reply struct {
	OK             bool     `json:"ok"`
	Error          string   `json:"error"`
	Seq            uint64   `json:"seq"`
	Seqs           []uint64 `json:"seqs"`
	Endpoint       string   `json:"endpoint"`
	ReplayEndpoint string   `json:"replay_endpoint"`
}

// Do sends one command and returns the answer; an answer with ok false is an error.
func (p *Publisher) Do(cmd map[string]any) (Reply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Reply{}, errors.New("pubtest: publisher closed")
	}
	b, err := json.Marshal(cmd)
	if err != nil {
		return Reply{}, err
	}
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		return Reply{}, fmt.Errorf("pubtest: %v; stderr: %s", err, p.stderr.String())
	}
	var r Reply
	if err := p.next(&r); err != nil {
		return r, err
	}
	if !r.OK {
		return r, fmt.Errorf("pubtest: %v failed: %s", cmd["cmd"], r.Error)
	}
	return r, nil
}

// WriteLine writes one raw line to the publisher's stdin without waiting for an answer
// (trace mode's --wait-go line).
func (p *Publisher) WriteLine(line string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("pubtest: publisher closed")
	}
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

// Event is one KV event for Publish. Type is BlockStored, BlockRemoved or
// AllBlocksCleared; Encoding ("array", "map") overrides the publisher's per event.
type Event struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes,omitempty"`
	Parent      *uint64  `json:"parent_block_hash,omitempty"`
	TokenIDs    []uint32 `json:"token_ids,omitempty"`
	BlockSize   int      `json:"block_size,omitempty"`
	LoraName    string   `json:"lora_name,omitempty"`
	Medium      string   `json:"medium,omitempty"`
	Encoding    string   `json:"encoding,omitempty"`
	// GroupIdx, SpecKind and SlidingWindow are a hybrid model's KV-cache group
	// (group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window); a nil GroupIdx
	// leaves the three out, as engines before hybrid groups do.
	GroupIdx      *int   `json:"group_idx,omitempty"`
	SpecKind      string `json:"kv_cache_spec_kind,omitempty"`
	SlidingWindow int    `json:"kv_cache_spec_sliding_window,omitempty"`
}

// FromOp turns a non-query op of an op log into the wire event an engine would publish
// for it: each content value c becomes one block of token ids tokens(c). For a stored op
// it also returns the blocks as (content hash, seq) pairs, as a reference model stores
// them. Cleared and remove_worker both become AllBlocksCleared: the protocol has no
// worker removal, and a worker with size 0 never matches.
func FromOp(op *oplog.Op, blockSize int, tokens func(uint64) []uint32) (Event, [][2]uint64) {
	switch op.Kind {
	case oplog.Stored:
		ev := Event{Type: "BlockStored", BlockSize: blockSize, BlockHashes: []uint64{}, TokenIDs: []uint32{}}
		if op.HasParent {
			p := op.Parent
			ev.Parent = &p
		}
		blocks := make([][2]uint64, len(op.Blocks))
		for i, b := range op.Blocks {
			t := tokens(b[0])
			ev.BlockHashes = append(ev.BlockHashes, b[1])
			ev.TokenIDs = append(ev.TokenIDs, t...)
			blocks[i] = [2]uint64{hash.Content(t), b[1]}
		}
		return ev, blocks
	case oplog.Removed:
		return Event{Type: "BlockRemoved", BlockHashes: op.Seqs}, nil
	default:
		return Event{Type: "AllBlocksCleared"}, nil
	}
}

// Publish publishes one batch on rank (live when send, else only buffered for replay)
// and returns its sequence number.
func (p *Publisher) Publish(rank int, send bool, events ...Event) (uint64, error) {
	if events == nil {
		events = []Event{}
	}
	r, err := p.Do(map[string]any{"cmd": "publish", "rank": rank, "events": events, "send": send})
	return r.Seq, err
}

// Raw sends arbitrary frames live on rank.
func (p *Publisher) Raw(rank int, frames ...[]byte) error {
	hx := make([]string, len(frames))
	for i, f := range frames {
		hx[i] = hex.EncodeToString(f)
	}
	_, err := p.Do(map[string]any{"cmd": "raw", "rank": rank, "frames_hex": hx})
	return err
}

// Resend sends buffered batch seq of rank again, live.
func (p *Publisher) Resend(rank int, seq uint64) error {
	_, err := p.Do(map[string]any{"cmd": "resend", "rank": rank, "seq": seq})
	return err
}

// Disconnect closes rank's PUB socket (subscribers lose their connection; batches
// published meanwhile are only buffered); Reconnect opens it again on the same port.
func (p *Publisher) Disconnect(rank int) error {
	_, err := p.Do(map[string]any{"cmd": "disconnect", "rank": rank})
	return err
}

// Reconnect: see Disconnect.
func (p *Publisher) Reconnect(rank int) error {
	_, err := p.Do(map[string]any{"cmd": "reconnect", "rank": rank})
	return err
}

// Restart replaces rank's publisher by a new one on the same ports: sequence back to
// 0, empty replay buffer (an engine process restart).
func (p *Publisher) Restart(rank int) error {
	_, err := p.Do(map[string]any{"cmd": "restart", "rank": rank})
	return err
}

// Stderr returns what the publisher printed on stderr so far (first 64 KiB).
func (p *Publisher) Stderr() string { return p.stderr.String() }

// Close stops the publisher (exit command, then closing stdin, then a kill after 10 s)
// and waits for it and its reader goroutine. Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	_ = p.stdin.Close()
	p.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		// Drain stdout so the process never blocks writing it.
		for range p.lines {
		}
		p.readWG.Wait()
		done <- p.cmd.Wait()
	}()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		_ = p.cmd.Process.Kill()
		return <-done
	}
}
