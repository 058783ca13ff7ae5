package shard

// Probe asks a shard for the members of one key, named by its fingerprint; the shard
// fills Off and N, which locate the answer in the batch's Out buffer.
type Probe struct {
	FP     uint64
	Off, N uint32
}

// Scan is one scan of a Batch: it names SFPs[F0:F1] and the workers SWids[W0:W1].
type Scan struct{ F0, F1, W0, W1 int32 }

// Batch is one query's probes for one shard in one round: a querier's pooled workspace.
//
// Ownership: the querier that fills it, except while it is answered: it passes to the
// shard when it is sent on the shard's query channel (Loop.Queries) and back when the
// shard signals Done, or it is answered on the querier's own goroutine (Loop.Serve).
// The shard writes only the answers (each probe's Off and N, Out past
// the first unanswered probe, SMiss) and the scan scratch at the end of the struct.
type Batch struct {
	// Done receives one signal per batch answered by the shard's goroutine (the
	// querier's channel, shared by its batches).
	Done   chan<- struct{}
	Start  int  // probes before Start were answered in an earlier round
	Flying bool // sent and not yet gathered: the shard owns it
	Probes []Probe
	Out    []uint32
	// Round 2's scans (deciders): each asks the shard, for each of some workers, for the
	// first position of its window, among the shard's positions of one run in position
	// order, whose members lack the worker.
	SDone int      // scans before SDone were answered in an earlier round
	Scans []Scan   // each names SFPs[F0:F1] and the workers [W0:W1]
	SFPs  []uint64 // the scans' fingerprints
	SWids []uint32 // the scans' workers
	SWin  []int32  // per worker: its window, SFPs[SWin[2k]:SWin[2k+1]]
	SMiss []int32  // the shard's answer: per worker, the index in SFPs of its first miss, or < 0
	// The querier's, which shards do not read: each fingerprint's position, and each
	// worker's candidate.
	SXs   []int32
	SCand []int32
	// Scan's scratch, written by whoever answers the batch (its shard's goroutine, or
	// the querying goroutine itself) and by nobody else meanwhile: the member list read
	// last, as a list and a set, and the scan's undecided workers. It is the batch's,
	// not the shard's: on the locked index many queriers scan one shard at once.
	members []uint32
	seen    IDSet
	active  []int32
}

// Settle marks every probe and scan of b answered, and b back with the querier.
func (b *Batch) Settle() { b.Start, b.SDone, b.Flying = len(b.Probes), len(b.Scans), false }

// Pending reports whether b has probes or scans not yet answered.
func (b *Batch) Pending() bool { return b.Start < len(b.Probes) || b.SDone < len(b.Scans) }

// IDSet is a set of worker ids that empties in O(1): an id is in it while its entry
// holds the set's stamp. Queries and shards' scans put one member list at a time in
// one, then test candidates against it. Owned by its holder (a query, a batch).
type IDSet struct {
	mark  []uint32
	stamp uint32
}

// Grow makes the set cover ids below n without growing again for each new id, so that
// a growing fleet does not reallocate it on every query.
func (s *IDSet) Grow(n int) {
	if len(s.mark) < n {
		s.mark = append(s.mark, make([]uint32, n+n/4-len(s.mark))...)
	}
}

// SetTo makes the set hold ids and nothing else.
func (s *IDSet) SetTo(ids []uint32) {
	if s.stamp++; s.stamp == 0 { // the stamps wrapped: start over
		clear(s.mark)
		s.stamp = 1
	}
	for _, id := range ids {
		if int(id) >= len(s.mark) {
			s.Grow(int(id) + 1)
		}
		s.mark[id] = s.stamp
	}
}

// Has reports whether id is in the set.
func (s *IDSet) Has(id uint32) bool { return int(id) < len(s.mark) && s.mark[id] == s.stamp }
