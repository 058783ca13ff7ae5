package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Batch is the work of one engine step, as a cost model sees it: the prefill chunks and
// the decodes the scheduler put in it.
type Batch struct {
	// Chunks are the step's prefill chunks (a prompt's, or a preempted request's
	// recompute): each computes New tokens on top of Context tokens already in KV.
	Chunks []Chunk
	// Decodes is the number of requests decoding one token, and DecodeContext the sum
	// of their contexts (the KV tokens their attention reads).
	Decodes       int
	DecodeContext int64
}

// Chunk is one prefill chunk of a step.
type Chunk struct{ New, Context int }

// CostModel gives the duration of an engine step.
type CostModel interface {
	StepTime(b *Batch) time.Duration
}

// Roofline is the default cost model: a step reads the weights once or computes its
// tokens' dense layers, whichever is slower, then adds attention and a per-request
// overhead:
//
//	step = max(Weights, PerToken * (decodes + s * prefill tokens))
//	     + s * PerPair * sum over chunks of New * (Context + (New+1)/2)
//	     + PerKVToken * DecodeContext
//	     + PerRequest * (chunks + Decodes)
//
// where a pair is one (query token, context token) product of prefill attention and s
// is PrefillScale (0 means 1), which scales prefill alone for sensitivity runs.
type Roofline struct {
	Weights      time.Duration
	PerToken     time.Duration
	PerPair      float64 // nanoseconds
	PerKVToken   float64 // nanoseconds
	PerRequest   time.Duration
	PrefillScale float64
}

// DefaultCostModel is the step time of Qwen3-32B in BF16 on two H100 SXM 80 GB GPUs
// with tensor parallelism 2, the engine of llm-d's published benchmarks: the roofline
// of the shipped profile "qwen3-32b-2xh100-tp2" (profiles/), whose one fitted number,
// the share of peak FLOP/s prefill reaches (0.60), makes an 8,192-token prefill alone
// take 8,192 / 15,928 s, llm-d's calibration of this engine (sim/README.md, "Cost
// model", gives the fit and its residuals).
var DefaultCostModel = mustDefaultCost()

func mustDefaultCost() Roofline {
	spec, err := ShippedProfile(DefaultProfile)
	if err != nil {
		panic(err) // the shipped files are tested
	}
	return spec.Roofline()
}

// MinStep is the shortest step any cost model gives: simulated time always advances.
const MinStep = time.Microsecond

// StepTime implements CostModel.
func (m Roofline) StepTime(b *Batch) time.Duration {
	s := m.PrefillScale
	if s == 0 {
		s = 1
	}
	var prefill int64
	var pairs float64
	for _, c := range b.Chunks {
		prefill += int64(c.New)
		pairs += float64(c.New) * (float64(c.Context) + float64(c.New+1)/2)
	}
	t := max(float64(m.Weights), float64(m.PerToken)*(float64(b.Decodes)+s*float64(prefill)))
	t += s*m.PerPair*pairs + m.PerKVToken*float64(b.DecodeContext)
	t += float64(m.PerRequest) * float64(len(b.Chunks)+b.Decodes)
	return max(MinStep, time.Duration(t))
}

// withPrefillScale returns the model with its prefill scaled by s.
func (m Roofline) withPrefillScale(s float64) CostModel {
	m.PrefillScale = s
	return m
}

// Profile is a measured cost model: time to first token of a request alone on the
// engine, TTFT(ISL, cached), and the step time of a batch of decodes, ITL(batch,
// context), each interpolated bilinearly on its grid of points (and extrapolated
// linearly beyond it). A step takes the TTFT of each of its chunks, as if it ran alone
// (ISL = Context + New, cached = Context), plus the ITL of its decodes at their mean
// context: mixed steps are charged as if their parts ran one after the other, which
// overstates them by one weight read each.
type Profile struct {
	ttft, itl grid
	scale     float64 // multiplies the TTFT part (0: 1)
}

// withPrefillScale returns the profile with its prefill scaled by s.
func (p *Profile) withPrefillScale(s float64) CostModel {
	q := *p
	q.scale = s
	return &q
}

// prefillScaler is a cost model whose prefill can be scaled (TimedConfig.PrefillScale).
type prefillScaler interface {
	withPrefillScale(s float64) CostModel
}

// ErrProfile wraps every problem with a profile file.
var ErrProfile = errors.New("sim: bad profile")

// MaxProfilePoints bounds the points of a profile file.
const MaxProfilePoints = 1 << 16

// ReadProfile reads a profile: CSV lines "ttft,ISL,CACHED,SECONDS" and
// "itl,BATCH,CONTEXT,SECONDS" (a header line starting with "kind" and lines starting
// with '#' are skipped). Each kind's points must form a full grid: every ISL-CACHED
// (for ttft, as new tokens ISL-CACHED and CACHED) and every BATCH-CONTEXT combination
// present once. Errors name the line.
func ReadProfile(r io.Reader) (*Profile, error) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), 1<<16)
	var ttft, itl []gridPoint
	line := 0
	for s.Scan() {
		line++
		t := strings.TrimSpace(s.Text())
		if t == "" || t[0] == '#' || strings.HasPrefix(strings.ToLower(t), "kind") {
			continue
		}
		if len(ttft)+len(itl) >= MaxProfilePoints {
			return nil, fmt.Errorf("%w: line %d: more than %d points", ErrProfile, line, MaxProfilePoints)
		}
		f := strings.Split(t, ",")
		if len(f) != 4 {
			return nil, fmt.Errorf("%w: line %d: want kind,x,y,seconds, got %q", ErrProfile, line, t)
		}
		var v [3]float64
		for i := range v {
			x, err := strconv.ParseFloat(strings.TrimSpace(f[i+1]), 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 || x > 1e12 {
				return nil, fmt.Errorf("%w: line %d: %q is not a number in 0..1e12", ErrProfile, line, f[i+1])
			}
			v[i] = x
		}
		switch k := strings.ToLower(strings.TrimSpace(f[0])); k {
		case "ttft":
			if v[1] > v[0] {
				return nil, fmt.Errorf("%w: line %d: cached %g > ISL %g", ErrProfile, line, v[1], v[0])
			}
			ttft = append(ttft, gridPoint{v[0] - v[1], v[1], v[2], line})
		case "itl":
			if v[0] < 1 {
				return nil, fmt.Errorf("%w: line %d: batch %g, want >= 1", ErrProfile, line, v[0])
			}
			itl = append(itl, gridPoint{v[0], v[1], v[2], line})
		default:
			return nil, fmt.Errorf("%w: line %d: kind %q, want ttft or itl", ErrProfile, line, f[0])
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrProfile, line+1, err)
	}
	var p Profile
	var err error
	if p.ttft, err = newGrid("ttft (new tokens x cached)", ttft); err != nil {
		return nil, err
	}
	if p.itl, err = newGrid("itl (batch x context)", itl); err != nil {
		return nil, err
	}
	return &p, nil
}

// StepTime implements CostModel.
func (p *Profile) StepTime(b *Batch) time.Duration {
	var t float64
	for _, c := range b.Chunks {
		t += max(0, p.ttft.at(float64(c.New), float64(c.Context)))
	}
	if p.scale != 0 {
		t *= p.scale
	}
	if b.Decodes > 0 {
		t += max(0, p.itl.at(float64(b.Decodes), float64(b.DecodeContext)/float64(b.Decodes)))
	}
	return max(MinStep, time.Duration(t*1e9))
}

type gridPoint struct {
	x, y, v float64
	line    int
}

// grid is a full grid of values v[i][j] at (xs[i], ys[j]), both increasing.
type grid struct {
	xs, ys []float64
	v      [][]float64
}

func newGrid(name string, pts []gridPoint) (grid, error) {
	var g grid
	if len(pts) == 0 {
		return g, fmt.Errorf("%w: no %s points", ErrProfile, name)
	}
	for _, p := range pts {
		g.xs, g.ys = append(g.xs, p.x), append(g.ys, p.y)
	}
	slices.Sort(g.xs)
	slices.Sort(g.ys)
	g.xs, g.ys = slices.Compact(g.xs), slices.Compact(g.ys)
	if len(g.xs)*len(g.ys) != len(pts) {
		return g, fmt.Errorf("%w: %s: %d points do not form a full grid of %d x %d values", ErrProfile, name, len(pts), len(g.xs), len(g.ys))
	}
	g.v = make([][]float64, len(g.xs))
	seen := make([][]bool, len(g.xs))
	for i := range g.v {
		g.v[i] = make([]float64, len(g.ys))
		seen[i] = make([]bool, len(g.ys))
	}
	for _, p := range pts {
		i, _ := slices.BinarySearch(g.xs, p.x)
		j, _ := slices.BinarySearch(g.ys, p.y)
		if seen[i][j] {
			return g, fmt.Errorf("%w: line %d: %s point (%g, %g) given twice", ErrProfile, p.line, name, p.x, p.y)
		}
		seen[i][j] = true
		g.v[i][j] = p.v
	}
	return g, nil
}

// segment returns the index i of the cell [xs[i], xs[i+1]] that x falls in (the first
// or last cell beyond the ends) and x's fraction across it; 0, 0 for one value.
func segment(xs []float64, x float64) (int, float64) {
	if len(xs) == 1 {
		return 0, 0
	}
	i, _ := slices.BinarySearch(xs, x)
	i = min(max(i-1, 0), len(xs)-2)
	return i, (x - xs[i]) / (xs[i+1] - xs[i])
}

// at interpolates bilinearly, extrapolating linearly from the edge cells.
func (g grid) at(x, y float64) float64 {
	i, fx := segment(g.xs, x)
	j, fy := segment(g.ys, y)
	v := func(a, b int) float64 { return g.v[min(a, len(g.xs)-1)][min(b, len(g.ys)-1)] }
	lo := v(i, j) + fy*(v(i, j+1)-v(i, j))
	hi := v(i+1, j) + fy*(v(i+1, j+1)-v(i+1, j))
	return lo + fx*(hi-lo)
}
