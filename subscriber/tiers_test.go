package subscriber

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/internal/refmodel"
)

func TestMediaTiersConfig(t *testing.T) {
	e := newEngine(t)
	base := Config{Endpoint: "tcp://127.0.0.1:1", Worker: "w", Index: e}
	resolve := func(mod func(*Config)) (map[string]engine.Tier, bool, error) {
		c := base
		mod(&c)
		_, err := New(c)
		cd := c.withDefaults()
		tiers, anyMed, err2 := cd.mediaTiers()
		if (err == nil) != (err2 == nil) {
			t.Fatalf("New %v, mediaTiers %v", err, err2)
		}
		if err != nil && !errors.Is(err, ErrConfig) {
			t.Fatalf("error %v does not wrap ErrConfig", err)
		}
		return tiers, anyMed, err
	}
	tiers, anyMed, err := resolve(func(*Config) {})
	if err != nil || anyMed {
		t.Fatal(err, anyMed)
	}
	want := map[string]engine.Tier{"": engine.TierDevice, "GPU": engine.TierDevice, "CPU": engine.TierHost,
		"CPU_TIER1": engine.TierHost, "CPU_PINNED": engine.TierHost, "STORAGE": engine.TierDisk, "FS": engine.TierDisk,
		"OBJ": engine.TierDisk, "DISK": engine.TierDisk, "CPU_TIER2": engine.TierDisk, "EXTERNAL": engine.TierDisk}
	if len(tiers) != len(want) {
		t.Fatalf("defaults %v", tiers)
	}
	for m, tier := range want {
		if tiers[m] != tier {
			t.Fatalf("default tier of %q is %v, want %v", m, tiers[m], tier)
		}
	}
	// Tiers adds and changes entries over the defaults.
	tiers, _, err = resolve(func(c *Config) { c.Tiers = map[string]engine.Tier{"NVME": engine.TierDisk, "CPU": engine.TierDisk} })
	if err != nil || tiers["NVME"] != engine.TierDisk || tiers["CPU"] != engine.TierDisk || tiers["GPU"] != engine.TierDevice {
		t.Fatal(err, tiers)
	}
	// Media narrows them; the old default keeps the device only.
	tiers, _, err = resolve(func(c *Config) { c.Media = []string{"", "GPU"} })
	if err != nil || len(tiers) != 2 {
		t.Fatal(err, tiers)
	}
	// "*" accepts every medium, those without a tier on the device tier.
	tiers, anyMed, err = resolve(func(c *Config) { c.Media = []string{"*"} })
	if err != nil || !anyMed || tiers["CPU"] != engine.TierHost {
		t.Fatal(err, anyMed, tiers)
	}
	for name, mod := range map[string]func(*Config){
		"listed medium without a tier": func(c *Config) { c.Media = []string{"GPU", "TAPE"} },
		"long medium": func(c *Config) {
			c.Tiers = map[string]engine.Tier{strings.Repeat("x", MaxMediumLen+1): engine.TierHost}
		},
		"unknown tier":   func(c *Config) { c.Tiers = map[string]engine.Tier{"X": engine.NumTiers} },
		"star in Tiers":  func(c *Config) { c.Tiers = map[string]engine.Tier{"*": engine.TierHost} },
		"too many media": func(c *Config) { c.Media = make([]string, MaxTierEntries+1) },
		"too many tiers": func(c *Config) {
			c.Tiers = map[string]engine.Tier{}
			for i := range MaxTierEntries + 1 {
				c.Tiers[strings.Repeat("m", i+1)] = engine.TierHost
			}
		},
	} {
		if _, _, err := resolve(mod); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A stream of one worker with device, host and disk media, and media no tier takes:
// the index answers what the reference model does, tier by tier.
func TestTieredStream(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	m := refmodel.New()
	a, ra := stored(nil, [2]uint64{1, 100}, [2]uint64{2, 101}, [2]uint64{3, 102})
	m.Stored("w", 0, false, ra)
	// SGLang's host tier publishes tokens and parents: an ordinary store on the host tier.
	h, rh := stored(p64(102), [2]uint64{4, 103})
	h.medium = "CPU_TIER1"
	m.StoredOn("w", 1, 102, true, rh)
	// vLLM's offloading connector: engine hashes only, copies of device blocks.
	cp := ev{kind: "stored", seqs: []uint64{100, 101, 102}, bs: testBS, medium: "CPU"}
	if _, err := m.Copied("w", 1, cp.seqs); err != nil {
		t.Fatal(err)
	}
	disk := ev{kind: "stored", seqs: []uint64{100, 999}, bs: 4 * testBS, medium: "STORAGE"} // 999: held nowhere
	if _, err := m.Copied("w", 2, disk.seqs); err != nil {
		t.Fatal(err)
	}
	tape := ev{kind: "stored", seqs: []uint64{100}, bs: testBS, medium: "TAPE"}
	gpuHashOnly := ev{kind: "stored", seqs: []uint64{500}, bs: testBS, medium: "GPU"}
	evict := ev{kind: "removed", seqs: []uint64{100, 101}}
	m.Removed("w", evict.seqs)
	cpuEvict := ev{kind: "removed", seqs: []uint64{101}, medium: "CPU"}
	m.RemovedOn("w", 1, cpuEvict.seqs)
	sendLive(t, s, 0, batch(a, h, cp, disk, tape, gpuHashOnly, evict, cpuEvict))
	st := s.Status()
	if st.Stored != 2 || st.Copied != 2 || st.Removed != 2 || st.Rejected[ReasonMedium] != 1 || st.Rejected[ReasonHashOnly] != 1 {
		t.Fatalf("status %+v", st)
	}
	if es := e.Stats(); es.SkippedCopies != 1 || es.TierBlocks != [engine.NumTiers]int64{1, 3, 1} {
		t.Fatalf("engine stats: skipped copies %d, tier blocks %v", es.SkippedCopies, es.TierBlocks)
	}
	q := contents(1, 2, 3, 4)
	ctx := context.Background()
	if err := e.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.FindMatchesIn(ctx, Namespace("m", ""), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := m.Query(q)
	// Device: 102 only (not a prefix); host: 100, 102, 103; disk: 100.
	if len(got) != 1 || len(want) != 1 || got[0].Tiers != want[0].Tiers || got[0].Score != want[0].Score || got[0].Size != want[0].Size {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if want[0].Tiers != [3]int{0, 1, 1} {
		t.Fatalf("model answers %+v", want)
	}
}

// A medium is the peer's string: a huge or binary one is dropped like any medium
// without a tier, costs one map lookup, and is not kept.
func TestHostileMedium(t *testing.T) {
	e := newEngine(t)
	s := newTestSub(t, e, &fakePub{}, false)
	a, _ := stored(nil, [2]uint64{1, 100})
	a.medium = strings.Repeat("G", 1<<20)
	b, _ := stored(nil, [2]uint64{2, 101})
	b.medium = "GPU\x00"
	c := ev{kind: "removed", seqs: []uint64{100}, medium: "\xff\xfe" + strings.Repeat("\x00", 300)}
	sendLive(t, s, 0, batch(a, b, c))
	st := s.Status()
	if st.Rejected[ReasonMedium] != 3 || st.Stored != 0 || st.Removed != 0 || st.State != StateLive {
		t.Fatalf("status %+v", st)
	}
	if n, _ := e.WorkerSize("w"); n != 0 {
		t.Fatalf("worker holds %d blocks", n)
	}
}
