package tokenize_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/kvindex/kvindex/internal/tokoracle"
	"github.com/kvindex/kvindex/tokenize"
)

// chatPrompt is a rendered multi-turn chat in Qwen's format (ChatML) of about n tokens:
// a system prompt, then user turns mixing prose, code and numbers, assistant answers,
// and the generation prompt. The same text is used for both models.
func chatPrompt(tok *tokenize.Tokenizer, n int) string {
	turn := []string{
		"Explain how the router picks a worker when two of them hold the same cached prefix. It's about load: we're sending 1,024-token prompts at 350 requests per second.",
		"Here is the code:\n```go\nfunc pick(ws []Worker) *Worker {\n\tbest := &ws[0]\n\tfor i := range ws {\n\t\tif ws[i].Load < best.Load {\n\t\t\tbest = &ws[i]\n\t\t}\n\t}\n\treturn best\n}\n```\nWhy does it return the first one on ties?",
		"The loop keeps the earlier worker because the comparison is strict (<, not <=). With 8 workers and 16-token blocks, a 7,000-token prompt is 437 blocks; hashing them costs about 2 µs.",
		"请用中文总结一下：缓存命中率从 63% 提高到了 91%，延迟下降了 40 毫秒。 😀👍",
	}
	var b strings.Builder
	b.WriteString("<|im_start|>system\nYou are a helpful assistant that answers questions about KV-cache routing.<|im_end|>\n")
	var ids []uint32
	for i := 0; ; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		b.WriteString("<|im_start|>" + role + "\n" + turn[i%len(turn)] + "<|im_end|>\n")
		ids, _ = tok.Encode(ids[:0], b.String(), false)
		if len(ids) >= n {
			break
		}
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

var jsTiming sync.Map // model -> float64 ns per encoding

// BenchmarkChatPrompt tokenizes and hashes (16-token blocks) a 7,000-token chat, and
// reports transformers.js's time for the same encoding, measured in the same run
// (js-ns/op). warm: the tokenizer has encoded the text before (its piece cache holds
// the pieces that need merging, as for the prefix a chat repeats in every request);
// cold: the cache is emptied before each encoding (the allocations then are the cache's
// fills, one per distinct merged piece). cpu-ns/op is the process's CPU time per encoding (user and system): on a
// shared machine it is the steadier figure, as ns/op also counts time spent waiting for
// a core.
func BenchmarkChatPrompt(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3.1"} {
		b.Run(model, func(b *testing.B) {
			tok := load(b, model)
			text := chatPrompt(tok, 7000)
			ids, _ := tok.Encode(nil, text, false)
			blocks, _ := hash.Blocks(nil, ids, 16)
			js, ok := jsTiming.Load(model)
			if !ok {
				res := tokoracle.Run(b, nil, &tokoracle.Bench{Model: model, Text: text, Iters: 20})
				js = res.BenchNs
				jsTiming.Store(model, js)
			}
			for _, cold := range []bool{false, true} {
				b.Run(map[bool]string{false: "warm", true: "cold"}[cold], func(b *testing.B) {
					b.SetBytes(int64(len(text)))
					b.ReportAllocs()
					cpu0, _ := cputime.Process()
					b.ResetTimer()
					for b.Loop() {
						if cold {
							tokenize.ForgetPieces(tok)
						}
						ids, _ = tok.Encode(ids[:0], text, false)
						blocks, _ = hash.Blocks(blocks[:0], ids, 16)
					}
					b.StopTimer()
					b.ReportMetric(cputime.PerOp(cpu0, b.N), "cpu-ns/op")
					b.ReportMetric(float64(len(ids)), "tokens")
					b.ReportMetric(js.(float64), "js-ns/op")
				})
			}
		})
	}
}

// TestEncodeAllocates checks that Encode and hashing allocate nothing per call once
// warm, on the synthetic tokenizer and on the real ones when the oracle is installed.
func TestEncodeAllocates(t *testing.T) {
	if testsize.Race {
		t.Skip("SKIP: the race detector makes sync.Pool drop items on purpose: allocations are counted without it")
	}
	check := func(t *testing.T, tok *tokenize.Tokenizer, text string) {
		ids, err := tok.Encode(nil, text, true)
		if err != nil {
			t.Fatal(err)
		}
		blocks, _ := hash.Blocks(nil, ids, 16)
		if n := testing.AllocsPerRun(20, func() {
			ids, _ = tok.Encode(ids[:0], text, true)
			blocks, _ = hash.Blocks(blocks[:0], ids, 16)
		}); n != 0 {
			t.Errorf("%v allocations per Encode of %d tokens", n, len(ids))
		}
	}
	text := strings.Join(corpus(3, 60), " ")
	t.Run("synthetic", func(t *testing.T) { check(t, newSynth(t), text) })
	for _, m := range oracleModels {
		t.Run(m, func(t *testing.T) {
			tok := load(t, m)
			check(t, tok, text)
			check(t, tok, chatPrompt(tok, 7000))
		})
	}
}
