package server_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/oplog"
	"github.com/kvindex/kvindex/internal/refmodel"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/subscriber/pubtest"
)

// TestHybridEndToEnd: a vLLM-shaped publisher of a hybrid model (full attention, a
// sliding window of 8 tokens, Mamba states every two blocks) into serve with
// kv_hybrid: /v1/match answers the longest cut every group accepts, as the reference
// model does, where a dense index would credit the whole prompt.
func TestHybridEndToEnd(t *testing.T) {
	pubtest.Require(t)
	pub, err := pubtest.Start(pubtest.Options{Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, mode := range []string{`"kv_hybrid": true`, `"kv_group_specs": [{"kind":"full","block_size":4},{"kind":"sliding_window","block_size":4,"window":8},{"kind":"mamba","block_size":8}]`,
		`"kv_group_kinds": ["full_attention"]`} {
		wantScore := 6
		if strings.Contains(mode, "kinds") {
			wantScore = 8 // the full-attention group alone: the whole prompt, which vLLM cannot reuse
		}
		t.Run(strings.Split(mode, `"`)[1], func(t *testing.T) {
			cfgJSON := fmt.Sprintf(`{
				"listen": "127.0.0.1:0", "reconnect_min": "10ms", "reconnect_max": "100ms",
				"engines": [{"endpoint": %q, "replay_endpoint": %q, "worker": "pod", "model": "m", "block_size": 4, %s}]
			}`, pub.Ranks[0].Endpoint, pub.Ranks[0].ReplayEndpoint, mode)
			cfg, err := server.ParseConfig(strings.NewReader(cfgJSON))
			if err != nil {
				t.Fatal(err)
			}
			_, c := start(t, cfg)
			c.waitReady(t)
			if _, err := pub.Publish(0, true, pubtest.Event{Type: "AllBlocksCleared"}); err != nil {
				t.Fatal(err)
			}
			toks := make([]uint32, 32) // 8 blocks of 4
			for i := range toks {
				toks[i] = uint32(100 + i)
			}
			content, _ := hash.Blocks(nil, toks, 4)
			seqs := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
			mseqs := []uint64{22, 24, 26, 28} // Mamba's states, one per two blocks
			g := func(i int) *int { return &i }
			store := func(group int, kind string, window int, bs int, ss []uint64) pubtest.Event {
				return pubtest.Event{Type: "BlockStored", BlockHashes: ss, TokenIDs: toks, BlockSize: bs,
					GroupIdx: g(group), SpecKind: kind, SlidingWindow: window}
			}
			var last uint64
			for _, b := range [][]pubtest.Event{
				{store(0, "full_attention", 0, 4, seqs), store(1, "sliding_window", 8, 4, seqs), store(2, "mamba", 0, 8, mseqs)},
				// The window keeps its last blocks; Mamba loses its state at 8 (tokens 32).
				{{Type: "BlockRemoved", BlockHashes: seqs[:4], GroupIdx: g(1)}, {Type: "BlockRemoved", BlockHashes: mseqs[3:], GroupIdx: g(2)}},
			} {
				if last, err = pub.Publish(0, true, b...); err != nil {
					t.Fatal(err)
				}
			}
			waitCaughtUp(t, c, []uint64{last})
			m := refmodel.New()
			if err := m.Groups("pod", 4, []oplog.GroupSpec{{Kind: "full", BlockSize: 4},
				{Kind: "sliding_window", BlockSize: 4, Window: 8, HasWindow: true}, {Kind: "mamba", BlockSize: 8}}); err != nil {
				t.Fatal(err)
			}
			blocks := make([][2]uint64, 8)
			for i := range blocks {
				blocks[i] = [2]uint64{content[i], seqs[i]}
			}
			mblocks := make([][2]uint64, 4)
			lists := make([][]uint64, 4)
			for i := range mblocks {
				mblocks[i], lists[i] = [2]uint64{content[2*i], mseqs[i]}, content[2*i:2*i+2]
			}
			for _, err := range []error{m.StoredIn("pod", 0, 0, 0, false, blocks, nil), m.StoredIn("pod", 1, 0, 0, false, blocks, nil),
				m.StoredIn("pod", 2, 0, 0, false, mblocks, lists)} {
				if err != nil {
					t.Fatal(err)
				}
			}
			m.RemovedIn("pod", 1, 0, seqs[:4])
			m.RemovedIn("pod", 2, 0, mseqs[3:])
			want := m.Query(content)
			// The cut falls to 6 blocks (Mamba's last state), whose window (8 tokens: the
			// two blocks before it, 5 and 6) is held.
			if len(want) != 1 || want[0].Score != 6 {
				t.Fatalf("model answers %+v, want pod at 6", want)
			}
			var mr server.MatchResponse
			body := fmt.Sprintf(`{"model":"m","content_hashes":%s}`, jsonUints(content))
			if code := c.do("POST", "/v1/match", body, &mr); code != 200 {
				t.Fatalf("match: %d", code)
			}
			if len(mr.Matches) != 1 || mr.Matches[0].Worker != "pod" || mr.Matches[0].Score != wantScore {
				t.Fatalf("matches %+v, want pod at %d", mr.Matches, wantScore)
			}
		})
	}
}

func jsonUints(v []uint64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, x := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, x)
	}
	b.WriteByte(']')
	return b.String()
}
