package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvindex/kvindex/hash"
)

// Request is one prefill the router places on a worker.
type Request struct {
	// Tokens is the input length in tokens. A trailing partial block is allocated by the
	// engine but never hashed, stored or queried.
	Tokens int
	// Blocks holds the content hash of each full block: len(Blocks) == Tokens/BlockSize.
	// Requests may share the backing array of a common prefix; never append to it.
	Blocks []uint64
	// At is the request's arrival in simulated time since the first request, when the
	// workload has timestamps (Workload.Timed, a trace); otherwise Run spaces arrivals
	// evenly at Config.Rate, and Simulate draws them from a Poisson process at it.
	At time.Duration
	// Output is the number of tokens the request generates (a trace's output_length):
	// Simulate decodes that many, at least one. Run ignores it.
	Output int
	// Next holds the content hashes of the full blocks the generated tokens complete,
	// when the workload knows what the engine generates (the built-in conversations,
	// whose next turn repeats the reply): the first completes the prompt's partial last
	// block. Simulate caches generated blocks under these hashes, and under hashes of
	// its own, never requested, beyond them. Shares backing arrays like Blocks.
	Next []uint64
	// Session names the conversation or user the request belongs to (0: none), for a
	// front load balancer with session affinity (TimedConfig.Affinity).
	Session uint64
	// After is 1 + the index of the request whose reply this one's prompt repeats
	// (the previous turn of its conversation), 0 for none: under the closed loop
	// (TimedConfig.OpenLoop false) Simulate holds the request until that one's last
	// token plus a think time. It is always smaller than 1 + the request's own index.
	After int
	// FromReply[k] counts the blocks of Blocks[:k+1] an earlier turn's reply completed
	// (the engine generated their tokens, or their last ones), so that hits on
	// generated blocks are told apart from hits on prompt blocks; nil when no block
	// came from a reply. Shares backing arrays like Blocks.
	FromReply []int32
}

// replyBlocks is how many of the request's first hit blocks came from replies.
func (r *Request) replyBlocks(hit int) int {
	if hit <= 0 || len(r.FromReply) == 0 {
		return 0
	}
	return int(r.FromReply[min(hit, len(r.FromReply))-1])
}

// Workload is a request sequence with a fixed block size.
type Workload struct {
	// Name says where the requests came from, e.g. "built-in conversations (seed 1)".
	Name string
	// Timed says the requests carry arrival times (Request.At).
	Timed bool
	// Kind is "built-in", "trace" or "shared-context".
	Kind string
	// BlockSize is the engine block size in tokens.
	BlockSize int
	Requests  []Request
	// Tokens and Blocks are the totals over Requests (input tokens, full blocks).
	Tokens, Blocks int64
	// MaxBlocks is the most blocks, partial one included, any request needs at once: a
	// worker's capacity must be at least this.
	MaxBlocks int
	// OutputTokens is the total of the requests' Output, and MaxSeqBlocks the most
	// blocks any request holds at its end in Simulate (prompt and output but its last
	// token, whose KV is never computed): a worker's capacity must be at least this.
	OutputTokens int64
	MaxSeqBlocks int
}

func (w *Workload) add(r Request) {
	w.Requests = append(w.Requests, r)
	w.Tokens += int64(r.Tokens)
	w.Blocks += int64(len(r.Blocks))
	w.MaxBlocks = max(w.MaxBlocks, (r.Tokens+w.BlockSize-1)/w.BlockSize)
	w.OutputTokens += int64(max(r.Output, 1))
	w.MaxSeqBlocks = max(w.MaxSeqBlocks, seqBlocks(r.Tokens, max(r.Output, 1), w.BlockSize))
}

// seqBlocks is the number of KV blocks a request of the given lengths holds when it
// finishes: its prompt and all its output tokens but the last have KV.
func seqBlocks(tokens, output, blockSize int) int {
	return (tokens + output - 1 + blockSize - 1) / blockSize
}

// Head returns a workload of the first n requests (all of them if n <= 0 or n is larger).
func (w *Workload) Head(n int) *Workload {
	if n <= 0 || n >= len(w.Requests) {
		return w
	}
	h := &Workload{Name: w.Name, BlockSize: w.BlockSize, Timed: w.Timed, Kind: w.Kind}
	for _, r := range w.Requests[:n] {
		h.add(r)
	}
	return h
}

// GenConfig describes the built-in workload: multi-turn conversations that open with one
// of a few shared system prompts (chosen with Zipf popularity) and grow turn by turn.
// Sessions conversations are live at any time; each request is the next turn of a
// uniformly chosen live one, and a finished conversation is replaced by a new one. A
// turn's prompt is the whole conversation so far (system prompt, every earlier user
// message and reply) plus the new user message; the reply is appended afterwards. The
// zero value of every field means its default.
type GenConfig struct {
	Seed      uint64
	Requests  int // default 40000
	BlockSize int // tokens per block, default 64
	// SystemPrompts is the number of distinct system prompts (default 16), each
	// SystemTokens[0]..SystemTokens[1] tokens long (default 512..4096).
	SystemPrompts int
	SystemTokens  [2]int
	// ZipfS is the popularity skew of the system prompts, > 1 (default 1.2).
	ZipfS float64
	// Sessions is the number of live conversations (default 384).
	Sessions int
	// MeanTurns is the mean number of turns of a conversation (geometric, default 8),
	// at most MaxTurns (default 32).
	MeanTurns float64
	MaxTurns  int
	// UserTokens and ReplyTokens bound a user message and a reply (defaults 16..512 and
	// 64..768 tokens).
	UserTokens, ReplyTokens [2]int
	// MaxContext ends a conversation whose next prompt would be longer (default 24576).
	MaxContext int
	// ReplyDropped is the fraction of each reply the next turn does not repeat, from
	// its end (default 0: chat clients send the whole history back, every earlier
	// assistant message verbatim; a reasoning model's template that drops earlier
	// turns' reasoning drops the matching share). The engine still generates the
	// whole reply; the blocks past the repeated part are never asked for again.
	ReplyDropped float64
}

// Defaults of the built-in workload.
const (
	DefaultRequests  = 40000
	DefaultBlockSize = 64
	DefaultSessions  = 384
)

func (g GenConfig) withDefaults() GenConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def2 := func(v *[2]int, lo, hi int) {
		if *v == [2]int{} {
			*v = [2]int{lo, hi}
		}
	}
	def(&g.Requests, DefaultRequests)
	def(&g.BlockSize, DefaultBlockSize)
	def(&g.SystemPrompts, 16)
	def2(&g.SystemTokens, 512, 4096)
	if g.ZipfS == 0 {
		g.ZipfS = 1.2
	}
	def(&g.Sessions, DefaultSessions)
	if g.MeanTurns == 0 {
		g.MeanTurns = 8
	}
	def(&g.MaxTurns, 32)
	def2(&g.UserTokens, 16, 512)
	def2(&g.ReplyTokens, 64, 768)
	def(&g.MaxContext, 24576)
	return g
}

func (g GenConfig) validate() error {
	rng := func(name string, v [2]int) error {
		if v[0] < 1 || v[1] < v[0] {
			return fmt.Errorf("sim: %s = %v, want 1 <= min <= max", name, v)
		}
		return nil
	}
	switch {
	case g.Requests < 0:
		return fmt.Errorf("sim: Requests = %d, want >= 0", g.Requests)
	case g.SystemPrompts < 1:
		return fmt.Errorf("sim: SystemPrompts = %d, want >= 1", g.SystemPrompts)
	case g.ZipfS <= 1:
		return fmt.Errorf("sim: ZipfS = %g, want > 1", g.ZipfS)
	case g.Sessions < 1:
		return fmt.Errorf("sim: Sessions = %d, want >= 1", g.Sessions)
	case g.MeanTurns < 1:
		return fmt.Errorf("sim: MeanTurns = %g, want >= 1", g.MeanTurns)
	case g.MaxTurns < 1:
		return fmt.Errorf("sim: MaxTurns = %d, want >= 1", g.MaxTurns)
	case !(g.ReplyDropped >= 0 && g.ReplyDropped <= 1):
		return fmt.Errorf("sim: ReplyDropped = %g, want 0..1", g.ReplyDropped)
	}
	if err := hash.CheckBlockSize(g.BlockSize); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	for _, c := range []struct {
		n string
		v [2]int
	}{{"SystemTokens", g.SystemTokens}, {"UserTokens", g.UserTokens}, {"ReplyTokens", g.ReplyTokens}} {
		if err := rng(c.n, c.v); err != nil {
			return err
		}
	}
	if g.MaxContext < g.SystemTokens[1]+g.UserTokens[1] {
		return fmt.Errorf("sim: MaxContext = %d, want >= the longest system prompt plus the longest user message (%d)",
			g.MaxContext, g.SystemTokens[1]+g.UserTokens[1])
	}
	return nil
}

// conversation is one live session of the generator.
type conversation struct {
	tokens []uint32 // the conversation so far
	blocks []uint64 // content hashes of its full blocks, kept in step with tokens
	// fromReply[k] counts the blocks of blocks[:k+1] a reply completed.
	fromReply []int32
	turns     int    // turns left, including the next one
	id        uint64 // its session, 1 for the first conversation
	last      int    // 1 + the index of its latest request, 0 before the first
}

// hashBlocks extends c.blocks to the full blocks of c.tokens; reply says the new
// blocks were completed by a reply.
func (c *conversation) hashBlocks(blockSize int, reply bool) error {
	full := len(c.tokens) / blockSize
	from := len(c.blocks)
	var err error
	c.blocks, err = hash.Blocks(c.blocks, c.tokens[from*blockSize:full*blockSize], blockSize)
	n := int32(0)
	if k := len(c.fromReply); k > 0 {
		n = c.fromReply[k-1]
	}
	for range len(c.blocks) - from {
		if reply {
			n++
		}
		c.fromReply = append(c.fromReply, n)
	}
	return err
}

// Generate builds the built-in workload. It is deterministic in g and prefix-stable: the
// first k requests do not depend on g.Requests.
func Generate(g GenConfig) (*Workload, error) {
	g = g.withDefaults()
	if err := g.validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(g.Seed, 0x6b76696e64657873)) // "kvindexs"
	between := func(v [2]int) int { return v[0] + r.IntN(v[1]-v[0]+1) }
	words := func(dst []uint32, n int) []uint32 {
		for range n {
			dst = append(dst, 1+r.Uint32N(50000)) // a 50k-token vocabulary
		}
		return dst
	}
	systems := make([][]uint32, g.SystemPrompts)
	for i := range systems {
		systems[i] = words(nil, between(g.SystemTokens))
	}
	zipf := rand.NewZipf(r, g.ZipfS, 1, uint64(g.SystemPrompts-1))
	// The mean of a geometric number of turns >= 1 is 1/p.
	pEnd := 1 / g.MeanTurns
	var convs uint64
	newConv := func() *conversation {
		convs++
		c := &conversation{turns: 1, id: convs}
		for c.turns < g.MaxTurns && r.Float64() >= pEnd {
			c.turns++
		}
		c.tokens = append(c.tokens, systems[zipf.Uint64()]...)
		return c
	}
	sessions := make([]*conversation, g.Sessions)
	w := &Workload{
		Name:      fmt.Sprintf("built-in conversations (seed %d, %d sessions, %d system prompts)", g.Seed, g.Sessions, g.SystemPrompts),
		BlockSize: g.BlockSize,
		Kind:      "built-in",
		Requests:  make([]Request, 0, g.Requests),
	}
	for len(w.Requests) < g.Requests {
		i := r.IntN(len(sessions))
		c := sessions[i]
		user := between(g.UserTokens)
		if c == nil || c.turns == 0 || len(c.tokens)+user > g.MaxContext {
			c = newConv()
			sessions[i] = c
		}
		c.tokens = words(c.tokens, user)
		if err := c.hashBlocks(g.BlockSize, false); err != nil {
			return nil, err
		}
		prompt := len(c.blocks)
		r := Request{Tokens: len(c.tokens), Blocks: slices.Clip(c.blocks), Session: c.id, After: c.last}
		if prompt > 0 && c.fromReply[prompt-1] > 0 {
			r.FromReply = slices.Clip(c.fromReply[:prompt])
		}
		c.turns--
		c.last = len(w.Requests) + 1
		// The reply is what the engine generates: its tokens and the blocks they
		// complete are the request's output; the next turn's prompt repeats the
		// reply but its dropped tail.
		reply := between(g.ReplyTokens)
		kept := reply - int(math.Round(g.ReplyDropped*float64(reply)))
		n := len(c.tokens)
		c.tokens = words(c.tokens, reply)[:n+kept]
		if err := c.hashBlocks(g.BlockSize, true); err != nil {
			return nil, err
		}
		r.Output, r.Next = reply, slices.Clip(c.blocks[prompt:])
		w.add(r)
	}
	return w, nil
}

// Ceiling is the hit rate an infinite cache shared by the whole fleet would reach on a
// workload: every block ever computed stays cached, and a request reuses the longest
// prefix of its blocks computed by any earlier request.
type Ceiling struct {
	// HitBlocks of Blocks full request blocks were cached (prefix-only, block-weighted).
	HitBlocks, Blocks int64
	// ReusedTokens of Tokens input tokens were not recomputed: the hit blocks, at most
	// (tokens-1)/BlockSize of them, as vLLM always recomputes the last prompt token.
	ReusedTokens, Tokens int64
}

// BlockHitRate is HitBlocks / Blocks (0 for no blocks).
func (c Ceiling) BlockHitRate() float64 { return ratio(c.HitBlocks, c.Blocks) }

// TokenHitRate is ReusedTokens / Tokens (0 for no tokens).
func (c Ceiling) TokenHitRate() float64 { return ratio(c.ReusedTokens, c.Tokens) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// ceilingSeed starts the prefix chain of the ceiling's set, so that a root block's key
// is a hash too and never equals a deeper block's by construction.
const ceilingSeed = 0x63656c696e67 // "celing"

// InfiniteCache computes the workload's Ceiling.
func InfiniteCache(w *Workload) Ceiling {
	seen := make(map[uint64]struct{}, w.Blocks/2)
	var c Ceiling
	for _, r := range w.Requests {
		h := uint64(ceilingSeed)
		hit, miss := 0, false
		for _, b := range r.Blocks {
			h = hash.Next(h, b)
			if _, ok := seen[h]; ok && !miss {
				hit++
				continue
			}
			miss = true
			seen[h] = struct{}{}
		}
		c.HitBlocks += int64(hit)
		c.Blocks += int64(len(r.Blocks))
		c.Tokens += int64(r.Tokens)
		c.ReusedTokens += int64(reusable(hit, r.Tokens, w.BlockSize) * w.BlockSize)
	}
	return c
}

// reusable is how many of hit cached blocks vLLM reuses for a prompt of tokens tokens:
// never the block holding the last prompt token, which it always recomputes.
func reusable(hit, tokens, blockSize int) int {
	if tokens == 0 {
		return 0
	}
	return min(hit, (tokens-1)/blockSize)
}

// ErrWorkload wraps problems with a workload's input.
var ErrWorkload = errors.New("sim: bad workload")
