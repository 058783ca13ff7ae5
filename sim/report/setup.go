package report

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/sim"
)

// CheckFleet checks a capacity sweep's fleet bounds: it needs no workload, which can take
// seconds to build.
func (sw Sweep) CheckFleet(workers int) error {
	if sw.Key != "capacity" {
		return nil
	}
	for _, c := range sw.Vals {
		if int64(workers)*int64(c) > sim.MaxFleetBlocks {
			return fmt.Errorf("--workers %d x capacity %d: more than %d blocks in all", workers, int64(c), sim.MaxFleetBlocks)
		}
	}
	return nil
}

// Check checks every run's config against the workload, before any runs: a sweep's
// last point must not fail after minutes of the others.
func (t Timed) Check() error {
	for k := range max(1, len(t.Sweep.Vals)) {
		c := t.Config
		if t.Sweep.Key != "" {
			t.Sweep.Apply(&c, k)
		}
		if int64(c.Workers)*int64(c.Capacity) > sim.MaxFleetBlocks {
			return fmt.Errorf("--workers %d x capacity %d: more than %d blocks in all", c.Workers, c.Capacity, sim.MaxFleetBlocks)
		}
		if err := c.Check(t.Workload); err != nil {
			msg := strings.TrimPrefix(err.Error(), sim.ErrConfig.Error()+": ")
			if strings.Contains(msg, "cannot hold") {
				msg += "; raise --capacity or the sweep's capacities"
			}
			return errors.New(msg)
		}
	}
	return nil
}

// LoadCost reads --profile: a shipped profile's name, an engine file (.profile) or a
// CSV of measured points. It returns the cost model, its description and, for an
// engine, its spec (zero for measured points).
func LoadCost(profile string) (sim.CostModel, string, sim.EngineSpec, error) {
	if profile == "" {
		profile = sim.DefaultProfile
	}
	var spec sim.EngineSpec
	if slices.Contains(sim.ShippedProfiles(), profile) {
		spec, err := sim.ShippedProfile(profile)
		if err != nil {
			return nil, "", spec, err
		}
		return spec.Roofline(), "roofline of " + spec.Name + " (profile " + profile + ")", spec, nil
	}
	fh, err := os.Open(profile)
	if err != nil {
		return nil, "", spec, fmt.Errorf("--profile %q is not a shipped profile (%s): %w", profile, strings.Join(sim.ShippedProfiles(), ", "), err)
	}
	defer fh.Close()
	if strings.HasSuffix(profile, ".profile") {
		if spec, err = sim.ReadEngineSpec(fh); err != nil {
			return nil, "", spec, fmt.Errorf("%s: %w", profile, err)
		}
		return spec.Roofline(), "roofline of " + spec.Name + " (" + profile + ")", spec, nil
	}
	p, err := sim.ReadProfile(fh)
	if err != nil {
		return nil, "", spec, fmt.Errorf("%s: %w", profile, err)
	}
	return p, "profile " + profile, spec, nil
}
