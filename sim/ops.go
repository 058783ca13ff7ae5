package sim

import (
	"bufio"
	"context"
	"fmt"
	"io"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
)

// OpsResult summarises a WriteOps call.
type OpsResult struct {
	// Ops counts the lines written: Queries query lines (Expectations of them with
	// expect/sizes), Stored stored lines and Removed removed lines.
	Ops, Queries, Expectations, Stored, Removed int
	// Bytes is the size of the log.
	Bytes int64
	// Sim is the run that produced the stream.
	Sim Result
}

// WriteOps runs the simulation like Run and writes its stream to out as a SPEC op log:
// one query line before each routed request (the router's question) followed by the
// stored and removed events of the engine that served it, in emission order. Every
// expectEvery-th query (none when expectEvery <= 0) carries expect and sizes, the exact
// answer of the reference model (internal/refmodel) at that point, so `kvindex replay
// --ops` on the log checks any implementation against the identical workload.
// cfg.Observer must be nil; WriteOps installs its own.
func WriteOps(ctx context.Context, out io.Writer, w *Workload, p Policy, cfg Config, expectEvery int) (OpsResult, error) {
	if cfg.Observer != nil {
		return OpsResult{}, fmt.Errorf("%w: WriteOps installs its own Observer", ErrConfig)
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	rec := &opRecorder{w: bw, model: refmodel.New(), every: expectEvery}
	cfg.Observer = rec
	res, err := Run(ctx, w, p, cfg)
	rec.res.Sim = res
	if err == nil {
		err = rec.err
	}
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	return rec.res, err
}

// opRecorder is the Observer behind WriteOps.
type opRecorder struct {
	w     *bufio.Writer
	model *refmodel.Model
	every int
	buf   []byte
	pairs [][2]uint64
	res   OpsResult
	err   error
}

func (r *opRecorder) write(op oplog.Op) error {
	r.buf = oplog.Append(r.buf[:0], op)
	n, err := r.w.Write(r.buf)
	r.res.Bytes += int64(n)
	r.res.Ops++
	if err != nil && r.err == nil {
		r.err = err
	}
	return err
}

func (r *opRecorder) Query(content []uint64) error {
	op := oplog.Op{Kind: oplog.Query, Content: content}
	r.res.Queries++
	if r.every > 0 && r.res.Queries%r.every == 0 {
		r.model.Expect(&op)
		r.res.Expectations++
	}
	return r.write(op)
}

func (r *opRecorder) Stored(worker string, tier engine.Tier, parent uint64, hasParent bool, blocks []engine.Block) error {
	r.pairs = r.pairs[:0]
	for _, b := range blocks {
		r.pairs = append(r.pairs, [2]uint64{b.Content, b.Seq})
	}
	// A rejection here is the contract's answer too: the log keeps the line and a
	// replayer must reject it the same way.
	_ = r.model.StoredOn(worker, int(tier), parent, hasParent, r.pairs)
	r.res.Stored++
	return r.write(oplog.Op{Kind: oplog.Stored, Worker: worker, Tier: uint8(tier), Parent: parent, HasParent: hasParent, Blocks: r.pairs})
}

func (r *opRecorder) Removed(worker string, tier engine.Tier, seqs []uint64) error {
	r.model.RemovedOn(worker, int(tier), seqs)
	r.res.Removed++
	return r.write(oplog.Op{Kind: oplog.Removed, Worker: worker, Tier: uint8(tier), Seqs: seqs})
}
