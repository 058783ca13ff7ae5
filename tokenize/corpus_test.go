package tokenize_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"unicode"
)

// The oracle's corpus: deterministic (a fixed PCG seed), so a failure names a prompt
// that reproduces, and made of the material tokenizers get wrong: ASCII prose and
// contractions, CJK, emoji sequences, combining marks (which Qwen's NFC composes), code,
// whitespace runs, digit runs, and special-token strings written inside text.

var (
	words = strings.Fields(`the quick brown fox jumps over lazy dog router cache prefix block
	token worker engine index hash match request model serve vLLM SGLang Llama Qwen KV
	GPU tensor attention layer prompt completion chat system user assistant tool call
	I you we they don't can't it's we're they've I'm you'll he'd IT'S WE'RE THEY'LL
	hello world alpha beta gamma delta naïve café résumé coöperate façade`)
	cjk = []string{"你好", "世界", "缓存", "路由器", "模型", "こんにちは", "ありがとう", "カタカナ",
		"漢字", "안녕하세요", "감사합니다", "数据中心", "令牌", "。", "，", "！", "？", "「引用」"}
	emoji = []string{"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🔥", "🚀", "✨", "🤖", "🧠", "⚙️", "🏳️‍🌈", "©", "™"}
	// combining: decomposed accents (e + U+0301), stacked marks, Hangul jamo, Devanagari.
	combining = []string{"e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "A\u030a", "\u1100\u1161\u11a8",
		"क\u094d\u0937", "z\u0335\u0336", "i\u0307", "\u0915\u093f"}
	code = []string{
		"func main() {\n\tfmt.Println(\"hi\")\n}\n",
		"def f(x):\n    return x ** 2  # square\n",
		"for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
		"SELECT * FROM t WHERE id = 42;\r\n",
		"if x != nil && y >= 3 || z <= -1 {\n\t\treturn\n\t}",
		"<div class=\"x\">&amp; &lt;tag&gt;</div>",
		"{\"key\": [1, 2.5, -3e10], \"ok\": true}",
		"$ echo $HOME | grep -v '^#' >> out.txt",
		"x := map[string]int{\"a\": 1}\n\n\n",
	}
	spaces   = []string{" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2003", "    \n\n    ", "\v", "\f"}
	digits   = []string{"0", "7", "42", "123", "1234", "98765", "3.14159", "1,000,000", "2026-12-06", "+1 (555) 010-9999", "٣٤٥", "１２３", "Ⅻ", "½"}
	specials = []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
		"<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_7|>",
		"<|python_tag|>", "<s>", "</s>", "<|im_sta", "<|", "|>", "<|im_start|><|im_start|>", "< |im_end| >"}
	punct = []string{".", ",", "!", "?", "...", "'s", "'S", "'ll", "'Re", "’s", "\"", "(", ")", "--", "—", "…", ":", ";", "'", "''", "#", "@", "%"}
)

// randomRunes draws n characters from a mixed alphabet. It leaves out the characters
// on which transformers.js knowingly differs from Hugging Face's Rust tokenizers (what
// vLLM runs, and what this package follows): U+0085 and U+FEFF (JavaScript's \s differs
// from Unicode's White_Space), U+017F (Oniguruma's (?i) folds it to s) and characters
// assigned after Unicode 15.0 (Go's tables).
func randomRunes(r *rand.Rand, n int) string {
	ranges := [][2]rune{
		{0x20, 0x7e}, {0x20, 0x7e}, {0x20, 0x7e}, {0xa0, 0xff}, {0x100, 0x17e}, {0x370, 0x3ff},
		{0x400, 0x4ff}, {0x5d0, 0x5ea}, {0x620, 0x64a}, {0x900, 0x97f}, {0xe01, 0xe3a},
		{0x300, 0x36f}, {0x4e00, 0x4fff}, {0x3041, 0x3096}, {0xac00, 0xacff}, {0x1f600, 0x1f64f},
		{0x1f300, 0x1f3ff}, {0x2000, 0x206f}, {0xff01, 0xff5e}, {0x2160, 0x2188}, {0x660, 0x669},
	}
	var b strings.Builder
	for range n {
		switch r.IntN(12) {
		case 0:
			b.WriteString(spaces[r.IntN(len(spaces))])
		case 1:
			b.WriteByte(byte(r.IntN(0x20))) // control characters, \t \n \r among them
		default:
			g := ranges[r.IntN(len(ranges))]
			c := g[0] + r.Int32N(g[1]-g[0]+1)
			if c == 0x85 || c == 0xfeff || c == 0x17f {
				c = 'x'
			}
			b.WriteRune(c)
		}
	}
	return b.String()
}

// corpus returns n prompts; every eighth is a random string.
func corpus(seed uint64, n int) []string {
	r := rand.New(rand.NewPCG(seed, 0x6b76696e646578))
	pick := func(list []string) string { return list[r.IntN(len(list))] }
	kinds := []func() string{
		func() string { return pick(words) },
		func() string { return " " + pick(words) },
		func() string { return pick(cjk) },
		func() string { return pick(emoji) },
		func() string { return pick(combining) },
		func() string { return pick(code) },
		func() string { return pick(spaces) },
		func() string { return pick(digits) },
		func() string { return pick(specials) },
		func() string { return pick(punct) },
		func() string { return strings.Repeat(pick(spaces), 1+r.IntN(40)) },
		func() string { return strings.Repeat("9", 1+r.IntN(20)) },
		func() string { return randomRunes(r, 1+r.IntN(8)) },
	}
	out := make([]string, 0, n)
	for i := range n {
		if i%8 == 7 {
			out = append(out, randomRunes(r, 1+r.IntN(200)))
			continue
		}
		var b strings.Builder
		parts := 1 + r.IntN(60)
		if i%50 == 0 {
			parts = 400 + r.IntN(400) // long prompts
		}
		for range parts {
			b.WriteString(kinds[r.IntN(len(kinds))]())
			if r.IntN(3) == 0 {
				b.WriteByte(' ')
			}
		}
		out = append(out, b.String())
	}
	out[0], out[1], out[2] = "", " ", fmt.Sprint("a", strings.Repeat(" ", 3), "\n")
	return out
}

// conversations returns n chats made of corpus text: an optional system turn, then
// alternating user and assistant turns ending with a user turn. Contents carry no
// leading or trailing whitespace (Python's or JavaScript's) and no </think>: @huggingface/jinja's strip ignores its
// argument (Python's strip('\n') does not), and Qwen3's template strips what follows an
// assistant's </think>: a difference of the oracle's template engine, not of
// tokenization (package chattemplate tests templates against Python's jinja2).
func conversations(seed uint64, n int) [][]map[string]any {
	r := rand.New(rand.NewPCG(seed, 0x63686174))
	texts := corpus(seed+1, 4*n)
	next := func() string {
		// Python's strip (Llama's template trims contents) also removes U+001C..U+001F;
		// JavaScript's does not.
		s := strings.TrimFunc(strings.ReplaceAll(texts[r.IntN(len(texts))], "</think>", "</th ink>"), func(r rune) bool {
			return unicode.IsSpace(r) || (0x1c <= r && r <= 0x1f)
		})
		if s == "" {
			s = "hello"
		}
		return s
	}
	out := make([][]map[string]any, n)
	for i := range out {
		var msgs []map[string]any
		if r.IntN(2) == 0 {
			msgs = append(msgs, map[string]any{"role": "system", "content": next()})
		}
		turns := 1 + 2*r.IntN(4)
		for k := range turns {
			role := "user"
			if k%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]any{"role": role, "content": next()})
		}
		out[i] = msgs
	}
	return out
}
