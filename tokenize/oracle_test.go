package tokenize_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/kvindex/kvindex/internal/tokoracle"
	"github.com/kvindex/kvindex/tokenize"
)

// oracleModels are the models compared with the oracle, and the tokenizers loaded for
// them (once per test binary: loading Qwen3's 11 MB tokenizer.json takes a while).
var oracleModels = []string{"qwen3", "llama3.1", "llama2"}

var loaded sync.Map // model -> *tokenize.Tokenizer

func load(t testing.TB, model string) *tokenize.Tokenizer {
	t.Helper()
	if tok, ok := loaded.Load(model); ok {
		return tok.(*tokenize.Tokenizer)
	}
	tok, err := tokenize.New(tokenize.Config{Dir: tokoracle.ModelDir(t, model)})
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(model, tok)
	return tok
}

// TestOracleCorpus compares token ids with transformers.js on the whole corpus, with
// the tokenizer's special tokens (a completions prompt) and, for every third prompt,
// without (a rendered chat).
func TestOracleCorpus(t *testing.T) {
	if !testsize.Full() {
		t.Skip("a sequential comparison with the reference, which the race detector slows 5-10x and adds nothing to: make test runs it in the plain build (its plain-pkgs phase)")
	}
	n := 2400
	if testing.Short() { // make test; make test-long compares all of them
		n = 600
	}
	compareWithOracle(t, corpus(1, n))
}

// TestOracleRandom is the oracle on random strings: a fresh seed each run (logged, so
// a failure reproduces with -run and KVINDEX_TOKENIZE_SEED).
func TestOracleRandom(t *testing.T) {
	if !testsize.Full() {
		t.Skip("a sequential comparison with the reference, which the race detector slows 5-10x and adds nothing to: make test runs it in the plain build (its plain-pkgs phase)")
	}
	seed := seedFromEnv(t)
	n := 500
	if testing.Short() {
		n = 150
	}
	compareWithOracle(t, corpus(seed, n))
}

func compareWithOracle(t *testing.T, prompts []string) {
	var jobs []tokoracle.Job
	for _, m := range oracleModels {
		for i, p := range prompts {
			jobs = append(jobs, tokoracle.Job{Model: m, Text: p, Special: i%3 != 2})
		}
	}
	res := tokoracle.Run(t, jobs, nil)
	toks := map[string]*tokenize.Tokenizer{}
	for _, m := range oracleModels {
		toks[m] = load(t, m)
	}
	bad := 0
	for i, j := range jobs {
		got, err := toks[j.Model].Encode(nil, j.Text, j.Special)
		if err != nil {
			t.Fatalf("%s %q: %v", j.Model, j.Text, err)
		}
		if want := res.IDs[i]; !slices.Equal(got, want) {
			bad++
			if bad <= 5 {
				t.Errorf("%s prompt %d (special %v) %q:\n got %v\nwant %v\nfirst difference at %d", j.Model, i%len(prompts), j.Special, j.Text, got, want, firstDiff(got, want))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d encodings differ", bad, len(jobs))
	}
	t.Logf("%d prompts x %d models identical to transformers.js", len(prompts), len(oracleModels))
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestOracleChats renders 500 conversations per model with the model's template and
// encodes them (vLLM's chat convention), comparing the text with @huggingface/jinja's
// rendering and the ids with transformers.js's.
func TestOracleChats(t *testing.T) {
	if !testsize.Full() {
		t.Skip("a sequential comparison with the reference, which the race detector slows 5-10x and adds nothing to: make test runs it in the plain build (its plain-pkgs phase)")
	}
	n := 500
	if testing.Short() {
		n = 150
	}
	convs := conversations(11, n)
	var jobs []tokoracle.Job
	for _, m := range []string{"qwen3", "llama3.1"} {
		for i, c := range convs {
			j := tokoracle.Job{Model: m, Messages: c, AddGenerationPrompt: i%5 != 4}
			if m == "qwen3" && i%3 == 0 {
				j.Kwargs = map[string]any{"enable_thinking": false}
			}
			jobs = append(jobs, j)
		}
	}
	res := tokoracle.Run(t, jobs, nil)
	models := map[string]*tokenize.Model{}
	bad := 0
	for i, j := range jobs {
		m := models[j.Model]
		if m == nil {
			var err error
			if m, err = tokenize.LoadModel(tokenize.ModelConfig{Dir: tokoracle.ModelDir(t, j.Model)}); err != nil {
				t.Fatal(err)
			}
			models[j.Model] = m
		}
		msgs, err := json.Marshal(j.Messages)
		if err != nil {
			t.Fatal(err)
		}
		ids, text, err := m.EncodeChat(nil, tokenize.Chat{MessagesJSON: msgs, AddGenerationPrompt: j.AddGenerationPrompt, Kwargs: j.Kwargs})
		if err != nil {
			t.Fatalf("%s conversation %d: %v", j.Model, i%len(convs), err)
		}
		if text != res.Texts[i] || !slices.Equal(ids, res.IDs[i]) {
			bad++
			if bad <= 3 {
				t.Errorf("%s conversation %d: texts equal %v, ids differ at %d\n text %.300q\n want %.300q", j.Model, i%len(convs), text == res.Texts[i], firstDiff(ids, res.IDs[i]), text, res.Texts[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d chats differ", bad, len(jobs))
	}
	t.Logf("%d conversations x 2 models: text and ids identical", len(convs))
}
