package report

import (
	"fmt"
	"math"
	"time"

	"github.com/kvindex/kvindex/sim"
)

// rows are the validation table, in order; sim/VALIDATION.md gives each source.
var rows = []row{
	{
		source:   "llm-d guides: precise-prefix-cache-routing, optimized-baseline (llm-d/llm-d)",
		workload: "shared_prefix 150 groups x 5, 6,000 + 1,200 tokens, output 1,000; 8 x Qwen3-32B 2xH100 TP2; ramp llm-d-guide (Poisson)",
		runs:     guideRuns,
		judge:    judgeGuide,
	},
	{
		source:   "llm-d-kv-cache-manager benchmarking/37-capacity",
		workload: "shared_prefix 83 groups x 3, 8,000 + 1,000 tokens, output 1,000; 4 x Llama-3.1-70B 4xH100 TP4, 461,376 KV tokens; ramp llm-d-37-capacity (constant); approximate: 2,200 keys of 64 tokens",
		runs:     capacityRuns,
		judge:    judgeCapacity,
	},
	{
		source:   "SGLang v0.4 cache-aware router (lm-sys blog 2024-12-04, sglang PR #2170)",
		workload: "generated-shared-prefix 64 groups x 16, 2,048 + 128 tokens, output 256, all at once; 8 x Llama-3.1-8B 1xA100 (data parallel)",
		runs:     sglangRuns,
		judge:    judgeSGLang,
	},
	{
		source:   "llm-d blog 2026-08-17, bottleneck-aware scheduling",
		workload: "b2b-saas (the guides' workload and ramp, the first row's runs); sticky-until-saturated (llmd-affinity) on events",
		runs:     func(float64) ([]run, error) { return nil, nil },
		judge:    judgeBlog,
	},
}

func guideRuns(scale float64) ([]run, error) {
	w, cfg, err := rampedSharedContext(sim.SharedContextConfig{Seed: 1, Groups: 150, GroupTokens: 6000, UsersPerGroup: 5, QueryTokens: 1200, Output: 1000},
		scaled("llm-d-guide", scale), 8, "qwen3-32b-2xh100-tp2")
	if err != nil {
		return nil, err
	}
	return runsOf("guide", w, cfg, nil, precise, approx, roundRobin, sticky)
}

// runsOf is one run per policy; approxCfg, when set, changes the approximate one's
// config.
func runsOf(key string, w *sim.Workload, cfg sim.TimedConfig, approxCfg func(*sim.TimedConfig), policies ...string) ([]run, error) {
	var out []run
	for _, p := range policies {
		c := cfg
		if p == approx && approxCfg != nil {
			approxCfg(&c)
		}
		r, err := policyRun(key, w, c, p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func judgeGuide(res map[string]sim.TimedResult) []Check {
	p, a, rr := res["guide/"+precise], res["guide/"+approx], res["guide/"+roundRobin]
	at15, at20 := stageAt(rr.Stages, 15), stageAt(rr.Stages, 20)
	return []Check{
		greater("precise / round-robin output tok/s over the ladder", 2.2, ladderOutput(p.Stages)/ladderOutput(rr.Stages)),
		check("round-robin p90 TTFT at 20 / at 15 QPS (its knee: 35 s / 1.6 s)", 35/1.6, p90(at20)/p90(at15), "> 3", p90(at20) > 3*p90(at15)),
		check("approximate / precise p90 TTFT, whole ladder (level: 0.206 / 0.262 s)", 0.206/0.262, a.TTFT.P90/p.TTFT.P90, "0.5..2",
			a.TTFT.P90 >= 0.5*p.TTFT.P90 && a.TTFT.P90 <= 2*p.TTFT.P90),
	}
}

func capacityRuns(scale float64) ([]run, error) {
	w, cfg, err := rampedSharedContext(sim.SharedContextConfig{Seed: 1, Groups: 83, GroupTokens: 8000, UsersPerGroup: 3, QueryTokens: 1000, Output: 1000},
		scaled("llm-d-37-capacity", scale), 4, "llama-3.1-70b-4xh100-tp4")
	if err != nil {
		return nil, err
	}
	// The estimate's shipped configuration: hashBlockSize 256 characters (64 tokens
	// at 4 a token), lruCapacityPerServer 2,200.
	return runsOf("37-capacity", w, cfg, func(c *sim.TimedConfig) { c.ApproxBlock, c.ApproxCapacity = 64, 2200 }, precise, approx)
}

func judgeCapacity(res map[string]sim.TimedResult) []Check {
	p, a := res["37-capacity/"+precise], res["37-capacity/"+approx]
	worst := 0.0
	for _, s := range p.Stages[1:] {
		worst = math.Max(worst, p90(s))
	}
	var pOut, aOut float64
	var n int
	for i, s := range a.Stages[1:] {
		if s.Rate >= 10 {
			aOut += s.OutputTokPerS
			pOut += p.Stages[i+1].OutputTokPerS
			n++
		}
	}
	aOut, pOut = aOut/float64(n), pOut/float64(n)
	return []Check{
		greater("precise / approximate output tok/s at 10 QPS", 6264/3798.6, stageAt(p.Stages, 10).OutputTokPerS/stageAt(a.Stages, 10).OutputTokPerS),
		check("precise p90 TTFT, worst stage (flat at about 0.4 s)", 0.486, worst, "< 1 s", worst < 1),
		check("approximate output tok/s, mean of 10-20 QPS (saturates)", (3798.6+3773.5+3200.9+3017.1)/4, aOut,
			"< precise", aOut < pOut),
	}
}

func sglangRuns(scale float64) ([]run, error) {
	users := max(2, int(math.Round(16*scale)))
	w, err := sim.SharedContext(sim.SharedContextConfig{Seed: 1, Groups: 64, GroupTokens: 2048, UsersPerGroup: users, QueryTokens: 128, Output: 256, EachOnce: true})
	if err != nil {
		return nil, err
	}
	cfg, err := engine("llama-3.1-8b-1xa100", 8, w.BlockSize)
	if err != nil {
		return nil, err
	}
	cfg.Ramp = sim.Ramp{Stages: []sim.Stage{{Rate: sim.MaxStageRate, Duration: time.Second}}}
	// SGLang's router keeps a radix tree of its own decisions, far larger than the
	// engines: an approximate cache keyed at the engine's block, effectively unbounded.
	return runsOf("sglang", w, cfg, func(c *sim.TimedConfig) { c.ApproxBlock, c.ApproxCapacity = w.BlockSize, 1<<20 }, approx, roundRobin)
}

func judgeSGLang(res map[string]sim.TimedResult) []Check {
	ca, rr := res["sglang/"+approx], res["sglang/"+roundRobin]
	return []Check{
		greater("cache-aware / round-robin throughput", 1.92, ca.OutputTokPerS/rr.OutputTokPerS),
		greater(fmt.Sprintf("cache-aware / round-robin block hit (75%% / 20%%; here %.0f%% / %.0f%%)", 100*ca.BlockHitRate(), 100*rr.BlockHitRate()),
			0.75/0.20, ca.BlockHitRate()/rr.BlockHitRate()),
	}
}

func judgeBlog(res map[string]sim.TimedResult) []Check {
	p, rr := res["guide/"+sticky], res["guide/"+roundRobin]
	kp, kr := knee(p.Stages[1:], 0, 2), knee(rr.Stages[1:], 0, 2)
	var hit, blocks int64
	for _, s := range p.Stages[1:] {
		if s.Rate > 20 {
			hit += s.HitBlocks
			blocks += s.Blocks
		}
	}
	rate := float64(hit) / float64(max(blocks, 1))
	return []Check{
		greater(fmt.Sprintf("sticky knee / round-robin knee (p90 <= 2 s; here %g / %g QPS)", kp, kr), 2.0, kp/math.Max(kr, 1)),
		check("sticky block hit past 20 QPS (90-95%)", 0.925, rate, ">= 0.9", rate >= 0.9),
	}
}
