package report

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvindex/kvindex/sim"
)

// Describe is what the reports say about w; source is built-in, shared-context or
// trace, and trace the trace file's path.
func Describe(w *sim.Workload, source, trace string) WorkloadInfo {
	return WorkloadInfo{Name: w.Name, Source: source, Trace: trace, Requests: len(w.Requests),
		Tokens: w.Tokens, Blocks: w.Blocks, BlockSize: w.BlockSize}
}

// TraceWorkload reads the Mooncake FAST'25 trace at path (its first limit records; 0:
// all) as a workload of blockSize-token blocks, with the trace's own ceiling at its
// 512-token ids. A file that cannot be opened gives os.Open's error unwrapped, so that
// the caller can say where to get a trace.
func TraceWorkload(path string, limit, blockSize int) (*sim.Workload, WorkloadInfo, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, WorkloadInfo{}, err
	}
	defer fh.Close()
	recs, err := sim.ReadTrace(fh, limit)
	if err != nil {
		return nil, WorkloadInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	w, err := sim.FromTrace("Mooncake trace "+filepath.Base(path), recs, blockSize)
	if err != nil {
		return nil, WorkloadInfo{}, err
	}
	wi := Describe(w, "trace", path)
	if h, r := sim.TraceCeiling(recs); r > 0 {
		x := float64(h) / float64(r)
		wi.TraceIDHitRate = &x
	}
	return w, wi, nil
}
