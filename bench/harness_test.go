package bench

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/engine"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary doubles as a fake peer driver (see peers_test.go).
	if mode := os.Getenv(fakePeerEnv); mode != "" {
		os.Exit(fakePeer(mode, os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func TestPartitionKeepsWorkerOrder(t *testing.T) {
	w := Builtin(3, 3000)
	for _, p := range []int{1, 2, 3, 8, 20} {
		parts := w.partition(p)
		seen := make([]bool, len(w.Events))
		owner := map[string]int{}
		for pi, part := range parts {
			if !slices.IsSorted(part) {
				t.Fatalf("p=%d: producer %d's events are out of stream order", p, pi)
			}
			for _, i := range part {
				if seen[i] {
					t.Fatalf("p=%d: event %d in two producers", p, i)
				}
				seen[i] = true
				name := w.Events[i].Worker
				if o, ok := owner[name]; ok && o != pi {
					t.Fatalf("p=%d: worker %q split between producers %d and %d", p, name, o, pi)
				}
				owner[name] = pi
			}
		}
		if slices.Contains(seen, false) {
			t.Fatalf("p=%d: some event belongs to no producer", p)
		}
	}
}

// TestApplyPassMatchesSequential checks that concurrent producers, and passes cut short
// (as benchmarks cut them), leave the state a sequential replay of the same events does.
func TestApplyPassMatchesSequential(t *testing.T) {
	w := Builtin(5, 4000)
	for _, limit := range []int{len(w.Events), len(w.Events) / 3} {
		ref, _ := RadixImpl().New()
		if _, err := applyPass(ref, w, w.partition(1), limit); err != nil {
			t.Fatal(err)
		}
		for _, impl := range Impls([]int{1, 3}) {
			idx, err := impl.New()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := applyPass(idx, w, w.partition(3), limit); err != nil {
				t.Fatal(err)
			}
			if got, want := idx.Blocks(), ref.Blocks(); got != want {
				t.Fatalf("%s limit %d: %d blocks, sequential radix %d", impl.Name, limit, got, want)
			}
			var got, want []engine.Match
			for _, q := range w.Queries {
				got, _ = idx.FindMatches(q, got[:0])
				want, _ = ref.FindMatches(q, want[:0])
				if !slices.Equal(got, want) {
					t.Fatalf("%s limit %d: query %v: got %v, sequential radix %v", impl.Name, limit, q, got, want)
				}
			}
			idx.Close()
		}
	}
}

// TestFlatEventsAreTheEvents: the timed passes' flat form gives back every event of
// the built-in workload, of its coalesced form, and of workloads where one field of
// engine.Event, each in turn (by reflection: a field added to Event that the flat form
// neither keeps nor sends to Events fails here), is set on every third event, field for
// field.
func TestFlatEventsAreTheEvents(t *testing.T) {
	w := Builtin(5, 4000)
	ws := []*Workload{w, w.Coalesced()}
	for fi := range reflect.TypeFor[engine.Event]().NumField() {
		if reflect.TypeFor[engine.Event]().Field(fi).Name == "Worker" {
			continue // an index into Workers, which NewWorkload made: the first two check it
		}
		odd := Builtin(6, 400)
		for i := 0; i < len(odd.Events); i += 3 {
			setSome(t, reflect.ValueOf(&odd.Events[i]).Elem().Field(fi))
		}
		ws = append(ws, odd)
	}
	for _, w := range ws {
		f := w.flatten()
		var ev engine.Event
		for i := range w.Events {
			got, want := *f.event(w, int32(i), &ev), w.Events[i]
			for _, e := range []*engine.Event{&got, &want} {
				if len(e.Blocks) == 0 {
					e.Blocks = nil
				}
				if len(e.Seqs) == 0 {
					e.Seqs = nil
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: event %d: flat form %+v, event %+v", w.Name, i, got, want)
			}
		}
	}
}

// setSome sets f to a value other than its zero (and other than the built-in workload's
// usual one where it can).
func setSome(t *testing.T, f reflect.Value) {
	t.Helper()
	switch f.Kind() {
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Bool:
		f.SetBool(!f.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f.SetInt(f.Int() + 3)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		f.SetUint(f.Uint() + 3)
	case reflect.Slice:
		f.Set(reflect.Append(f, reflect.Zero(f.Type().Elem())))
	default:
		t.Fatalf("engine.Event field of kind %s: give it a value here", f.Kind())
	}
}

func TestRunAndReport(t *testing.T) {
	w := Builtin(1, 3000)
	if w.Checked == 0 || len(w.Queries) == 0 || len(w.Events) == 0 {
		t.Fatalf("built-in workload: %d events, %d queries, %d checked", len(w.Events), len(w.Queries), w.Checked)
	}
	opt := Options{Duration: 5 * time.Millisecond, Producers: []int{1, 3}, Queriers: 2, MaxPasses: 2, MaxLoops: 2}
	var results []Result
	for _, impl := range Impls([]int{1, 2}) {
		r, err := Run(impl, w, opt)
		if err != nil {
			t.Fatal(err)
		}
		if r.Verify.Failed > 0 || r.Verify.Passed != w.Checked {
			t.Fatalf("%s: verify %+v, want %d passed", impl.Name, r.Verify, w.Checked)
		}
		if len(r.Events) != 2 || r.Events[1].Producers != 3 || r.Events[0].Passes < 1 || r.Events[0].EventsPerSec <= 0 {
			t.Fatalf("%s: events %+v", impl.Name, r.Events)
		}
		if r.Load.Queries == 0 || r.Rest.Queries == 0 || r.Load.P50 <= 0 || r.Rest.P999 < r.Rest.P50 {
			t.Fatalf("%s: load %+v rest %+v", impl.Name, r.Load, r.Rest)
		}
		if r.Load.Loops > opt.MaxLoops {
			t.Fatalf("%s: streamer ran %d loops, bound %d", impl.Name, r.Load.Loops, opt.MaxLoops)
		}
		// Engines of several shards count their queries' work (every query waits for
		// at least one round trip, probes at least position 0); the others (the
		// locked index, one shard: they walk the index) say they do not.
		rounds, probes := r.Rest.RoundsPerQuery, r.Rest.ProbesPerQuery
		if sharded := strings.HasPrefix(impl.Name, "engine/") && impl.Name != "engine/shards=1"; sharded && (rounds < 1 || probes < 1) ||
			!sharded && (rounds != -1 || probes != -1) {
			t.Fatalf("%s: %.3f round trips, %.1f probes per query at rest", impl.Name, rounds, probes)
		}
		if len(results) > 0 && r.Memory.Memberships != results[0].Memory.Memberships {
			t.Fatalf("%s: %d memberships, %s has %d", impl.Name, r.Memory.Memberships, results[0].Impl, results[0].Memory.Memberships)
		}
		results = append(results, r)
	}
	if results[0].Memory.Memberships == 0 {
		t.Fatal("the built-in workload leaves the index empty")
	}
	h := Header{Command: "kvindex bench --duration 5ms --markdown", Workload: w, Options: opt}
	for _, md := range []bool{true, false} {
		var buf bytes.Buffer
		if err := WriteReport(&buf, h, results, md); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		for _, want := range []string{h.Command, "events/s P=3", "p99.9", "bytes/membership", "engine/shards=2", "radix", fmt.Sprintf("%d/%d", w.Checked, w.Checked)} {
			if !strings.Contains(out, want) {
				t.Errorf("markdown=%v: report lacks %q:\n%s", md, want, out)
			}
		}
		if md && !strings.Contains(out, "| --- | ---: |") {
			t.Errorf("markdown report has no table:\n%s", out)
		}
	}
}

func TestVerifyCatchesWrongAnswers(t *testing.T) {
	w := Builtin(2, 2000)
	wrong := Impl{Name: "wrong", New: func() (Index, error) {
		idx, _ := RadixImpl().New()
		return dropLast{idx}, nil
	}}
	r, err := Verify(wrong, w)
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed == 0 || r.First == "" {
		t.Fatalf("an index that drops answers passed verification: %+v", r)
	}
}

// dropLast answers every query without its last match.
type dropLast struct{ Index }

func (d dropLast) FindMatches(content []uint64, dst []engine.Match) ([]engine.Match, error) {
	start := len(dst)
	dst, err := d.Index.FindMatches(content, dst)
	if len(dst) > start {
		dst = dst[:len(dst)-1]
	}
	return dst, err
}

func TestFormatting(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{rate(0), "-"}, {rate(12.345), "12.3"}, {rate(1234), "1.23k"}, {rate(2.5e6), "2.50M"},
		{dur(450), "450 ns"}, {dur(1500), "1.50 µs"}, {dur(2_340_000), "2.34 ms"},
		{Thousands(0), "0"}, {Thousands(1234567), "1,234,567"}, {Thousands(-1000), "-1,000"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
