package main

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/server"
)

// TestEngineFlagHybrid: --engine's kv_hybrid and kv_group_specs keys.
func TestEngineFlagHybrid(t *testing.T) {
	var e engineFlags
	if err := e.Set("endpoint=tcp://h:1,block_size=16,kv_group_specs=full:16|sliding_window:16:4096|mamba:64"); err != nil {
		t.Fatal(err)
	}
	if err := e.Set("endpoint=tcp://h:2,block_size=16,kv_hybrid=true"); err != nil {
		t.Fatal(err)
	}
	want := []server.KVGroupSpec{{Kind: "full", BlockSize: 16}, {Kind: "sliding_window", BlockSize: 16, Window: 4096}, {Kind: "mamba", BlockSize: 64}}
	if !slices.Equal(e[0].KVGroupSpecs, want) || !e[1].KVHybrid {
		t.Fatalf("parsed %+v", e)
	}
	for _, bad := range []string{"kv_group_specs=full", "kv_group_specs=full:x", "kv_group_specs=sliding_window:16:w", "kv_group_specs=full:16:1:2", "kv_hybrid=maybe"} {
		if err := e.Set("endpoint=tcp://h:3,block_size=16," + bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
