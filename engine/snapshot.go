package engine

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/engine/internal/chain"
	"github.com/kvindex/kvindex/engine/internal/worker"
	"github.com/kvindex/kvindex/internal/atomicfile"
	"github.com/kvindex/kvindex/internal/readlimit"
	"github.com/kvindex/kvindex/internal/table"
	"github.com/kvindex/kvindex/shard"
)

// Snapshot format, version 5. All integers are little-endian.
//
//	magic    "KVIXSNAP"
//	version  u32 = 5
//	chain    u32: 0 for SPEC's XXH3 prefix chain, 1 for the keyed chain, then its key
//	         (4 x u64); the prefixes below are that chain's words (engine/internal/chain)
//	nsCount  u32, then nsCount names (u32 length + bytes, at most MaxNamespaceLen),
//	         sorted; a block's namespace is 0 for the default namespace or 1 + its index
//	         in this list
//	workers  u32, then per worker, sorted by name:
//	           name (u32 length + bytes, at most MaxWorkerLen), cursor u64, mark u64
//	           (the worker's Position),
//	           per tier (device, host, disk): count u64,
//	             count entries sorted by seq: seq u64, prefix u64, parent u64, pos u32, ns u32
//	           groups u32: 0 for a worker without KV-cache groups, else the number of
//	             its groups (groups.go), then the declaration's unit u32 and per group
//	             kind u32, block size u32, window u32 (as EventGroups gave them); then per group,
//	             per tier: count u64, count entries sorted by seq: seq u64, prefix u64,
//	             end u32, ns u32
//	crc      u32: CRC-32C (Castagnoli) of every byte before it
//
// Version 4 is the same without the mark (restored as 0); version 3 is version 4
// without the groups field; version 2 is version 3 without the
// chain field (its prefixes are SPEC's chain), and version 1 is version 2 with one count
// and its entries per worker (the device tier); Restore reads all five, and an engine
// restored from version 1 or 2 keeps SPEC's chain. The chain key is a secret of the engine that wrote the snapshot (it decides
// which sequences of content hashes a client would have to send to make two prefixes
// collide), so a snapshot is as private as the engine's memory; with Config.SpecChain
// a snapshot carries no key. A block entry carries its parent's prefix hash so that Restore
// rebuilds each tier's key bookkeeping (ghost keys, holes) exactly; 32 bytes per
// (worker, tier, block).
const (
	snapshotMagic   = "KVIXSNAP"
	snapshotVersion = 5
	snapshotEntry   = 32
	groupEntry      = 24

	chainSpec  = 0
	chainKeyed = 1
)

// ErrSnapshot wraps every reason a snapshot is refused: truncation, a bad checksum, an
// unknown version, or content that contradicts itself.
var ErrSnapshot = errors.New("engine: bad snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteSnapshot writes the engine's state to w. Each worker is captured under its lock,
// so its blocks and its position (Event.Cursor, Event.Mark) are one consistent point of
// its event stream; workers are independent, so resuming each worker's stream after its cursor on
// a restored engine reproduces the state of an engine that never stopped. Events that
// race with WriteSnapshot land either in it or after their worker's cursor. The output is
// deterministic: equal states give equal bytes.
func (e *Engine) WriteSnapshot(w io.Writer) error {
	if e.closed.Load() {
		return e.err()
	}
	// The body is captured before anything is written: the names written before it are
	// those its blocks use.
	names, count, body := e.captureWorkers()
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<16)
	var scratch [4]byte
	put32 := func(v uint32) { binary.LittleEndian.PutUint32(scratch[:], v); bw.Write(scratch[:]) }
	bw.WriteString(snapshotMagic)
	put32(snapshotVersion)
	if e.env.Chain.Spec() {
		put32(chainSpec)
	} else {
		put32(chainKeyed)
		var w8 [8]byte
		for _, k := range e.env.Chain.Key().Words() {
			binary.LittleEndian.PutUint64(w8[:], k)
			bw.Write(w8[:])
		}
	}
	put32(uint32(len(names)))
	for _, n := range names {
		put32(uint32(len(n)))
		bw.WriteString(n)
	}
	put32(count)
	bw.Write(body)
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("engine: writing snapshot: %w", err)
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc.Sum32())
	if _, err := w.Write(sum[:]); err != nil {
		return fmt.Errorf("engine: writing snapshot: %w", err)
	}
	return nil
}

// captureWorkers captures every live worker, each under its lock, in name order, with
// the namespaces its blocks use numbered by their rank in the sorted names (1-based; 0
// is the default). No name is dropped meanwhile (the sweep's lock is held), so every
// namespace a captured block uses is named; the names no block uses are not written.
func (e *Engine) captureWorkers() (names []string, count uint32, body []byte) {
	e.ns.sweepMu.Lock()
	defer e.ns.sweepMu.Unlock()
	var workers []*worker.Worker
	for ws, i := e.workers(), 0; i < len(ws); i++ {
		if wk := ws[i].Load(); wk != nil && !wk.IsComponent() {
			workers = append(workers, wk)
		}
	}
	slices.SortFunc(workers, func(a, b *worker.Worker) int { return strings.Compare(a.Name(), b.Name()) })
	// A worker removed meanwhile is skipped; count only what is written. Blocks are
	// written with their namespace ids, whose offsets nsAt keeps, and renumbered once
	// every worker is captured.
	var buf bytes.Buffer
	var entries []worker.Entry
	var nsAt []int
	for _, wk := range workers {
		e.lockWorker(wk)
		if wk.Dead() {
			e.unlockWorker(wk)
			continue
		}
		var hdr [8]byte
		binary.LittleEndian.PutUint32(hdr[:4], uint32(len(wk.Name())))
		buf.Write(hdr[:4])
		buf.WriteString(wk.Name())
		cursor, mark := wk.Position()
		binary.LittleEndian.PutUint64(hdr[:], cursor)
		buf.Write(hdr[:])
		binary.LittleEndian.PutUint64(hdr[:], mark)
		buf.Write(hdr[:])
		for t := range worker.Tier(NumTiers) {
			entries = e.captureTier(&buf, wk.TierOf(&e.env, t, false), &nsAt, entries)
		}
		captureGroups(&buf, wk.Hybrid(), &nsAt)
		e.unlockWorker(wk)
		count++
	}
	body = buf.Bytes()
	byID := e.namespaceNames()
	rank := map[uint32]uint32{}
	for _, at := range nsAt {
		id := binary.LittleEndian.Uint32(body[at:])
		if _, ok := rank[id]; !ok {
			name, ok := byID[id]
			if !ok {
				panic("engine: a captured block's namespace has no name")
			}
			rank[id] = 0
			names = append(names, name)
		}
	}
	slices.Sort(names)
	ids := make(map[string]uint32, len(rank))
	for id := range rank {
		ids[byID[id]] = id
	}
	for i, name := range names {
		rank[ids[name]] = uint32(i + 1)
	}
	for _, at := range nsAt {
		binary.LittleEndian.PutUint32(body[at:], rank[binary.LittleEndian.Uint32(body[at:])])
	}
	return names, count, body
}

// captureTier appends one tier's count and entries (c nil: none) to buf, each block's
// namespace as its id, whose offset in buf goes to nsAt when it is not the default
// namespace. entries is scratch.
func (e *Engine) captureTier(buf *bytes.Buffer, c *worker.Worker, nsAt *[]int, entries []worker.Entry) []worker.Entry {
	entries = entries[:0]
	if c != nil {
		entries = c.AppendEntries(&e.env, entries)
	}
	slices.SortFunc(entries, func(a, b worker.Entry) int { return cmp.Compare(a.Seq, b.Seq) })
	var scratch [snapshotEntry]byte
	binary.LittleEndian.PutUint64(scratch[:8], uint64(len(entries)))
	buf.Write(scratch[:8])
	for _, x := range entries {
		if x.Key.NS != 0 {
			*nsAt = append(*nsAt, buf.Len()+28)
		}
		binary.LittleEndian.PutUint64(scratch[0:], x.Seq)
		binary.LittleEndian.PutUint64(scratch[8:], x.Key.Prefix)
		binary.LittleEndian.PutUint64(scratch[16:], x.Parent)
		binary.LittleEndian.PutUint32(scratch[24:], x.Key.Pos)
		binary.LittleEndian.PutUint32(scratch[28:], x.Key.NS)
		buf.Write(scratch[:])
	}
	return entries
}

// WriteSnapshotFile writes a snapshot to path atomically: to a temporary file in the
// same directory, synced, then renamed over path, and the directory synced.
func (e *Engine) WriteSnapshotFile(path string) error {
	var werr error
	err := atomicfile.Write(path, func(w io.Writer) error {
		werr = e.WriteSnapshot(w)
		return werr
	})
	if err != nil && err != werr {
		return fmt.Errorf("engine: snapshot: %w", err)
	}
	return err
}

// Cursors returns each known worker's cursor: Positions without the marks.
func (e *Engine) Cursors() map[string]uint64 {
	out := map[string]uint64{}
	for w, p := range e.Positions() {
		out[w] = p.Cursor
	}
	return out
}

// Positions returns each known worker's position (see Event.Cursor), each read under
// the worker's lock.
func (e *Engine) Positions() map[string]Position {
	out := map[string]Position{}
	e.eachLiveWorker(func(wk *worker.Worker) {
		cursor, mark := wk.Position()
		out[wk.Name()] = Position{cursor, mark}
	})
	return out
}

// Restore starts an engine with cfg and loads a snapshot written by WriteSnapshot into
// it. The snapshot is read whole and its checksum verified before anything is applied;
// a truncated, corrupted or self-contradicting snapshot returns an error wrapping
// ErrSnapshot and no engine. maxBytes bounds how much is read (0: no bound beyond the
// reader's end).
func Restore(cfg Config, r io.Reader, maxBytes int64) (*Engine, error) {
	data, err := readlimit.ReadAll(r, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: reading: %v", ErrSnapshot, err)
	}
	return RestoreBytes(cfg, data)
}

// RestoreBytes is Restore from a snapshot already in memory; it does not keep data.
func RestoreBytes(cfg Config, data []byte) (*Engine, error) {
	if len(data) < len(snapshotMagic)+4+4 {
		return nil, fmt.Errorf("%w: truncated (%d bytes)", ErrSnapshot, len(data))
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if string(body[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: not a kvindex snapshot", ErrSnapshot)
	}
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch (truncated or corrupted)", ErrSnapshot)
	}
	p := &snapReader{b: body[len(snapshotMagic):]}
	v := p.u32()
	if v < 1 || v > snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads versions 1 to %d", ErrSnapshot, v, snapshotVersion)
	}
	tiers := Tier(NumTiers)
	if v == 1 {
		tiers = 1 // the device tier only
	}
	groups, marks := v >= 4, v >= 5
	ch, err := p.chain(v)
	if err != nil {
		return nil, err
	}
	cfg.SpecChain = ch.Spec()
	e, err := newEngine(cfg, table.NewSeed(), ch)
	if err != nil {
		return nil, err
	}
	if err := e.load(p, tiers, groups, marks); err != nil {
		e.Close()
		return nil, err
	}
	// A restored engine starts at rest: its first query sees every block it loaded.
	if err := e.Barrier(context.Background()); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// chain reads the prefix chain of a snapshot of version v: SPEC's before version 3.
func (p *snapReader) chain(v uint32) (chain.Chain, error) {
	if v < 3 {
		return chain.New(true, table.Seed{}), nil
	}
	switch kind := p.u32(); {
	case p.err != nil:
		return chain.Chain{}, p.err
	case kind == chainSpec:
		return chain.New(true, table.Seed{}), nil
	case kind == chainKeyed:
		var w [4]uint64
		for i := range w {
			w[i] = p.u64()
		}
		if p.err != nil {
			return chain.Chain{}, p.err
		}
		return chain.New(false, table.SeedOf(w)), nil
	default:
		return chain.Chain{}, fmt.Errorf("%w: unknown prefix chain %d", ErrSnapshot, kind)
	}
}

// load reads the namespaces and workers of a snapshot whose workers each list tiers
// tiers, and their KV-cache groups when groups is set and marks when marks is.
func (e *Engine) load(p *snapReader, tiers Tier, groups, marks bool) error {
	nsCount := p.u32()
	if uint64(nsCount)*4 > uint64(len(p.b)) {
		return fmt.Errorf("%w: namespace count %d", ErrSnapshot, nsCount)
	}
	nsIDs := make([]uint32, nsCount)
	prevNS := ""
	for i := range nsIDs {
		name := p.str(MaxNamespaceLen)
		switch {
		case p.err != nil:
		case name == "":
			p.fail("empty namespace name")
		case i > 0 && name <= prevNS:
			p.fail(fmt.Sprintf("namespace %q duplicated or out of order", name))
		}
		if p.err != nil {
			return p.err
		}
		prevNS = name
		if nsIDs[i] = e.namespaceID(name, nsIntern); nsIDs[i] == 0 {
			return fmt.Errorf("%w: its namespaces take more than Config.NamespaceBytes (%d)", ErrSnapshot, e.cfg.NamespaceBytes)
		}
	}
	workers := p.u32()
	prev := ""
	out := e.getOutbox()
	defer e.outboxes.Put(out)
	for i := uint32(0); i < workers && p.err == nil; i++ {
		name := p.str(MaxWorkerLen)
		cursor := p.u64()
		var mark uint64
		if marks {
			mark = p.u64()
		}
		if p.err != nil {
			break
		}
		if name == "" || (i > 0 && name <= prev) {
			return fmt.Errorf("%w: worker names empty or out of order", ErrSnapshot)
		}
		prev = name
		w := e.lockLive(name, true, nil, out)
		w.SetPosition(cursor, mark)
		w.LoadBegin()
		for t := Tier(0); t < tiers && p.err == nil; t++ {
			e.loadTier(p, w, t, nsCount, nsIDs)
		}
		w.LoadEnd(&e.env)
		if groups && p.err == nil {
			e.loadGroups(p, w, nsCount, nsIDs)
		}
		if err := e.flush(w); err != nil && p.err == nil {
			p.err = err
		}
		e.unlock(w)
	}
	if p.err == nil && len(p.b) != 0 {
		p.fail("trailing bytes")
	}
	return p.err
}

// loadTier reads one tier's count and blocks of worker w (locked) into its component for
// tier t; a failure is left in p.err.
func (e *Engine) loadTier(p *snapReader, w *worker.Worker, t Tier, nsCount uint32, nsIDs []uint32) {
	n := p.u64()
	if p.err != nil {
		return
	}
	if n > uint64(len(p.b))/snapshotEntry {
		p.fail(fmt.Sprintf("worker %q claims %d blocks", w.Name(), n))
		return
	}
	if n == 0 {
		return
	}
	name := w.Name()
	w = w.TierOf(&e.env, worker.Tier(t), true)
	var lastSeq uint64
	// A key held under several seqs has one parent: WriteSnapshot writes the same
	// parent for each, and a snapshot that disagrees would not restore to itself.
	parents := make(map[shard.Key]uint64)
	for j := uint64(0); j < n; j++ {
		seq, prefix, parent := p.u64(), p.u64(), p.u64()
		pos, ns := p.u32(), p.u32()
		if p.err != nil {
			break
		}
		if j > 0 && seq <= lastSeq {
			p.fail("seqs out of order")
			break
		}
		lastSeq = seq
		if pos >= MaxDepth || ns > nsCount {
			p.fail("position or namespace out of range")
			break
		}
		if pos == 0 && parent != 0 {
			p.fail(fmt.Sprintf("worker %q: root block (seq %d) with a parent", name, seq))
			break
		}
		if ns > 0 {
			ns = nsIDs[ns-1]
		}
		k := shard.Key{Prefix: prefix, Pos: pos, NS: ns}
		if old, seen := parents[k]; seen && old != parent {
			p.fail(fmt.Sprintf("worker %q: block (seq %d) held with two parents", name, seq))
			break
		}
		parents[k] = parent
		if !w.HasRoom(1) {
			p.fail(fmt.Sprintf("worker %q holds more than MaxSegments (%d) on one tier", name, MaxSegments))
			break
		}
		w.LoadEntry(&e.env, seq, k, parent)
	}
}

type snapReader struct {
	b   []byte
	err error
}

func (p *snapReader) fail(why string) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s", ErrSnapshot, why)
	}
}

func (p *snapReader) take(n int) []byte {
	if p.err != nil || len(p.b) < n {
		p.fail("truncated")
		return nil
	}
	out := p.b[:n]
	p.b = p.b[n:]
	return out
}

func (p *snapReader) u32() uint32 {
	if b := p.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (p *snapReader) u64() uint64 {
	if b := p.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a name of at most limit bytes (MaxWorkerLen, MaxNamespaceLen: the engine
// never holds a longer one, so WriteSnapshot never writes one).
func (p *snapReader) str(limit int) string {
	n := p.u32()
	if p.err == nil && n > uint32(limit) {
		p.fail(fmt.Sprintf("name of %d bytes (limit %d)", n, limit))
		return ""
	}
	if b := p.take(int(n)); b != nil {
		return string(b)
	}
	return ""
}
