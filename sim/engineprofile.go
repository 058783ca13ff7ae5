package sim

import (
	"bufio"
	"embed"
	"fmt"
	"io"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// EngineSpec describes an inference engine from first principles: its model's shape,
// its GPUs' peaks and the shares of them it reaches. Roofline derives the step cost
// from it. The shipped profiles (profiles/*.profile, ShippedProfile) are EngineSpecs
// with the sources of every number in their comments.
type EngineSpec struct {
	// Name says which model on which GPUs, e.g. "Qwen3-32B BF16, 2 x H100 80GB, TP 2".
	Name string
	// Params is the model's parameter count; Layers, Heads, KVHeads and HeadDim its
	// attention shape; BytesPerParam and KVBytes the weights' and the KV cache's
	// element size (2 for BF16).
	Params                          float64
	Layers, Heads, KVHeads, HeadDim int
	BytesPerParam, KVBytes          float64
	// GPUs serve one engine (tensor parallel); GPUTFLOPs is one GPU's dense BF16 peak
	// and GPUTBps its memory bandwidth.
	GPUs               int
	GPUTFLOPs, GPUTBps float64
	// MFU is the share of the peak FLOP/s prefill reaches, BWEff the share of the
	// bandwidth a weight or KV read reaches; StepOverhead is added to every weight
	// read (all-reduces, launches) and PerRequest to every request of a step.
	MFU, BWEff   float64
	StepOverhead time.Duration
	PerRequest   time.Duration
	// KVTokens is one engine's KV cache in tokens, as the engine reports it.
	KVTokens int
	// MaxNumSeqs and MaxNumBatchedTokens are the engine's scheduler defaults on these
	// GPUs (vLLM's max_num_seqs and max_num_batched_tokens; optional, 0 for the
	// simulator's defaults).
	MaxNumSeqs, MaxNumBatchedTokens int
}

// DefaultProfile is the shipped profile DefaultCostModel and DefaultTimedCapacity
// describe.
const DefaultProfile = "qwen3-32b-2xh100-tp2"

//go:embed profiles/*.profile
var shippedProfiles embed.FS

// ShippedProfiles names the profiles shipped with the simulator, sorted.
func ShippedProfiles() []string {
	ents, _ := shippedProfiles.ReadDir("profiles")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".profile"))
	}
	sort.Strings(names)
	return names
}

// ShippedProfile returns the shipped profile named name.
func ShippedProfile(name string) (EngineSpec, error) {
	f, err := shippedProfiles.Open(path.Join("profiles", name+".profile"))
	if err != nil {
		return EngineSpec{}, fmt.Errorf("%w: no shipped profile %q (want one of %s)", ErrProfile, name, strings.Join(ShippedProfiles(), ", "))
	}
	defer f.Close()
	return ReadEngineSpec(f)
}

// ReadEngineSpec reads an engine profile: lines "key value" ('#' starts a comment),
// the keys EngineSpec's fields in snake case (name, params, layers, heads, kv_heads,
// head_dim, bytes_per_param, kv_bytes, gpus, gpu_tflops, gpu_tbps, mfu, bw_eff,
// step_overhead, per_request, kv_tokens, max_num_seqs, max_num_batched_tokens), every
// one required but name and the last two. Errors name the line.
func ReadEngineSpec(r io.Reader) (EngineSpec, error) {
	var e EngineSpec
	nums := map[string]*float64{"params": &e.Params, "bytes_per_param": &e.BytesPerParam, "kv_bytes": &e.KVBytes,
		"gpu_tflops": &e.GPUTFLOPs, "gpu_tbps": &e.GPUTBps, "mfu": &e.MFU, "bw_eff": &e.BWEff}
	ints := map[string]*int{"layers": &e.Layers, "heads": &e.Heads, "kv_heads": &e.KVHeads, "head_dim": &e.HeadDim,
		"gpus": &e.GPUs, "kv_tokens": &e.KVTokens}
	durs := map[string]*time.Duration{"step_overhead": &e.StepOverhead, "per_request": &e.PerRequest}
	optional := map[string]*int{"max_num_seqs": &e.MaxNumSeqs, "max_num_batched_tokens": &e.MaxNumBatchedTokens}
	seen := map[string]bool{}
	s := bufio.NewScanner(io.LimitReader(r, 1<<20))
	line := 0
	for s.Scan() {
		line++
		t, _, _ := strings.Cut(s.Text(), "#")
		key, val, _ := strings.Cut(strings.TrimSpace(t), " ")
		val = strings.TrimSpace(val)
		if key == "" {
			continue
		}
		if seen[key] {
			return e, fmt.Errorf("%w: line %d: %s given twice", ErrProfile, line, key)
		}
		seen[key] = true
		var err error
		switch {
		case key == "name":
			e.Name = val
		case nums[key] != nil:
			var x float64
			x, err = strconv.ParseFloat(val, 64)
			if err == nil && !(x > 0 && x < 1e15) {
				err = fmt.Errorf("out of range")
			}
			*nums[key] = x
		case ints[key] != nil || optional[key] != nil:
			var n int
			n, err = strconv.Atoi(val)
			if err == nil && (n < 1 || n > 1<<30) {
				err = fmt.Errorf("out of range")
			}
			if ints[key] != nil {
				*ints[key] = n
			} else {
				*optional[key] = n
			}
		case durs[key] != nil:
			var d time.Duration
			d, err = time.ParseDuration(val)
			if err == nil && (d < 0 || d > time.Second) {
				err = fmt.Errorf("out of range")
			}
			*durs[key] = d
		default:
			return e, fmt.Errorf("%w: line %d: unknown key %q", ErrProfile, line, key)
		}
		if err != nil {
			return e, fmt.Errorf("%w: line %d: %s %q: %v", ErrProfile, line, key, val, err)
		}
	}
	if err := s.Err(); err != nil {
		return e, fmt.Errorf("%w: %v", ErrProfile, err)
	}
	for _, m := range []map[string]bool{keysOf(nums), keysOf(ints), keysOf(durs)} {
		for k := range m {
			if !seen[k] {
				return e, fmt.Errorf("%w: %s missing", ErrProfile, k)
			}
		}
	}
	if e.MFU > 1 || e.BWEff > 1 {
		return e, fmt.Errorf("%w: mfu %g and bw_eff %g must be at most 1", ErrProfile, e.MFU, e.BWEff)
	}
	return e, nil
}

func keysOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// Roofline derives the engine's step cost:
//
//	Weights    = Params x BytesPerParam / GPUs / (GPUTBps x BWEff) + StepOverhead
//	PerToken   = 2 x Params / (GPUs x GPUTFLOPs x MFU)
//	PerPair    = 4 x Layers x Heads x HeadDim / (GPUs x GPUTFLOPs x MFU)
//	PerKVToken = Layers x KVHeads x HeadDim x 2 x KVBytes / GPUs / (GPUTBps x BWEff)
func (e EngineSpec) Roofline() Roofline {
	flops := float64(e.GPUs) * e.GPUTFLOPs * 1e12 * e.MFU // per second
	bw := e.GPUTBps * 1e12 * e.BWEff                      // bytes per second per GPU
	weights := e.Params * e.BytesPerParam / float64(e.GPUs) / bw
	kv := float64(e.Layers*e.KVHeads*e.HeadDim) * 2 * e.KVBytes / float64(e.GPUs) / bw
	return Roofline{
		Weights:    time.Duration(math.Round(weights*1e9)) + e.StepOverhead,
		PerToken:   time.Duration(math.Round(2 * e.Params / flops * 1e9)),
		PerPair:    4 * float64(e.Layers*e.Heads*e.HeadDim) / flops * 1e9,
		PerKVToken: kv * 1e9,
		PerRequest: e.PerRequest,
	}
}

// PrefillAlone is the time to first token of a request alone on the engine: its
// uncached tokens prefilled in steps of chunk tokens on top of cached ones, each step
// timed by m.
func PrefillAlone(m CostModel, tokens, cached, chunk int) time.Duration {
	var t time.Duration
	for done := cached; done < tokens; {
		n := min(chunk, tokens-done)
		t += m.StepTime(&Batch{Chunks: []Chunk{{New: n, Context: done}}})
		done += n
	}
	return t
}
