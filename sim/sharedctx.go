package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvindex/kvindex/hash"
)

// SharedContextConfig describes llm-d's benchmark workload shape ("KV-Cache Wins You
// Can See"; inference-perf's shared_prefix data): Groups customers, each with a
// context of GroupTokens tokens shared by its UsersPerGroup users, each user with a
// query of QueryTokens tokens of their own. Every request is one user's query after
// its customer's context, the user drawn uniformly, so the same prompts recur (the
// cache demand is the contexts plus the queries: 150 x 6,000 + 750 x 1,200 = 1.8 M
// tokens, 73% of llm-d's 8 x 307,328). The zero value of every field means its
// default, llm-d's.
type SharedContextConfig struct {
	Seed          uint64
	Requests      int // default DefaultSharedRequests
	BlockSize     int // default 64
	Groups        int // default 150
	GroupTokens   int // default 6000
	UsersPerGroup int // default 5
	QueryTokens   int // default 1200
	// Output is every request's output length in tokens (default 1000, the
	// output_len of llm-d's sibling benchmark, 37-capacity; the blog gives none).
	Output int
	// EachOnce sends every user's query exactly once, in a random order (SGLang's
	// generated-shared-prefix benchmark), Groups x UsersPerGroup requests in all;
	// Requests is ignored.
	EachOnce bool
}

// Defaults of the shared-context workload.
const (
	DefaultSharedRequests = 12000
	// DefaultSharedRate is its arrival rate in requests per simulated second (Poisson):
	// sim/README.md shows rising rates.
	DefaultSharedRate = 10
	// MaxSharedTokens bounds GroupTokens and QueryTokens, and MaxSharedPrompts
	// Groups x UsersPerGroup.
	MaxSharedTokens  = 1 << 20
	MaxSharedPrompts = 1 << 20
)

func (c SharedContextConfig) withDefaults() SharedContextConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Requests, DefaultSharedRequests)
	def(&c.BlockSize, DefaultBlockSize)
	def(&c.Groups, 150)
	def(&c.GroupTokens, 6000)
	def(&c.UsersPerGroup, 5)
	def(&c.QueryTokens, 1200)
	def(&c.Output, 1000)
	return c
}

// SharedContext builds the shared-context workload. It is deterministic in c and
// prefix-stable.
func SharedContext(c SharedContextConfig) (*Workload, error) {
	c = c.withDefaults()
	switch {
	case c.Requests < 0:
		return nil, fmt.Errorf("%w: shared-context requests %d, want >= 0", ErrWorkload, c.Requests)
	case c.Groups < 1 || c.UsersPerGroup < 1 || int64(c.Groups)*int64(c.UsersPerGroup) > MaxSharedPrompts:
		return nil, fmt.Errorf("%w: %d groups x %d users, want at least 1 x 1 and at most %d prompts", ErrWorkload, c.Groups, c.UsersPerGroup, MaxSharedPrompts)
	case c.GroupTokens < 0 || c.GroupTokens > MaxSharedTokens || c.QueryTokens < 1 || c.QueryTokens > MaxSharedTokens:
		return nil, fmt.Errorf("%w: context %d and query %d tokens, want 0..%d and 1..%d", ErrWorkload, c.GroupTokens, c.QueryTokens, MaxSharedTokens, MaxSharedTokens)
	case c.Output < 1 || c.Output > MaxOutput:
		return nil, fmt.Errorf("%w: output %d tokens, want 1..%d", ErrWorkload, c.Output, MaxOutput)
	}
	if err := hash.CheckBlockSize(c.BlockSize); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	// A prompt's blocks are hashed once, when its user first asks, and shared by every
	// request of that user after.
	r := rand.New(rand.NewPCG(c.Seed, 0x7368617265647078)) // "sharedpx"
	words := func(dst []uint32, n int) []uint32 {
		for range n {
			dst = append(dst, 1+r.Uint32N(50000))
		}
		return dst
	}
	contexts := make([][]uint32, c.Groups)
	for g := range contexts {
		contexts[g] = words(nil, c.GroupTokens)
	}
	type prompt struct {
		tokens int
		blocks []uint64
	}
	prompts := make([]*prompt, c.Groups*c.UsersPerGroup)
	w := &Workload{
		Name: fmt.Sprintf("shared context (seed %d, %d groups x %d-token contexts, %d users each, %d-token queries)",
			c.Seed, c.Groups, c.GroupTokens, c.UsersPerGroup, c.QueryTokens),
		BlockSize: c.BlockSize, Kind: "shared-context", Requests: make([]Request, 0, c.Requests),
	}
	pick := rand.New(rand.NewPCG(c.Seed, 0x7069636b)) // "pick": apart, so prompts do not depend on the order
	var order []int
	if c.EachOnce {
		order = pick.Perm(len(prompts))
		c.Requests = len(order)
	}
	var tokens []uint32
	for len(w.Requests) < c.Requests {
		var u int
		if order != nil {
			u = order[len(w.Requests)]
		} else {
			u = pick.IntN(len(prompts))
		}
		p := prompts[u]
		if p == nil {
			tokens = append(tokens[:0], contexts[u/c.UsersPerGroup]...)
			tokens = words(tokens, c.QueryTokens)
			blocks, err := hash.Blocks(nil, tokens, c.BlockSize)
			if err != nil {
				return nil, err
			}
			p = &prompt{tokens: len(tokens), blocks: blocks}
			prompts[u] = p
		}
		w.add(Request{Tokens: p.tokens, Blocks: p.blocks, Output: c.Output, Session: uint64(u) + 1})
	}
	return w, nil
}
