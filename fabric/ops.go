package fabric

import (
	"context"

	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/replay"
)

// PublishOps publishes the events of an op log (queries are skipped) under model, in
// model's namespace (replay.ModelEvent: the one a replica serving model queries),
// numbering each worker's events 1, 2, 3, ... in log order. The numbering depends on
// the log alone, so publishing the same log again (a relay restarted from the
// beginning of its input) adds nothing to the stream. An event the publisher refuses
// (Refusal: too large even split, malformed) is counted in its Stats and skipped. It
// returns how many events it handed to the publisher.
func PublishOps(ctx context.Context, p *Publisher, model string, ops []oplog.Op) (int, error) {
	seqs := map[string]uint64{}
	n := 0
	for i := range ops {
		ev := replay.ModelEvent(&ops[i], model)
		if ev.Kind == 0 {
			continue
		}
		seqs[ev.Worker]++
		if err := p.Publish(ctx, model, &ev, seqs[ev.Worker]); err != nil && !Refusal(err) {
			return n, err
		}
		n++
	}
	return n, nil
}
