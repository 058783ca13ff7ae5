package server_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/fakevllm"
	"github.com/kvindex/kvindex/internal/testsize"
	"github.com/kvindex/kvindex/internal/tokoracle"
	"github.com/kvindex/kvindex/server"
	"github.com/kvindex/kvindex/tokenize"
)

// idsJSON writes token ids as a JSON array.
func idsJSON(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

// TestTextMatchEqualsTokens: /v1/match with a prompt or messages, and /v1/route with the
// OpenAI body, answer as /v1/match does for the token ids the model folder makes of the
// same text, and say how many tokens it made.
func TestTextMatchEqualsTokens(t *testing.T) {
	dir := tokoracle.TinyModel(t)
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{
		Listen:     "127.0.0.1:0",
		Engines:    []server.EngineConfig{{Worker: "a", Model: "m", BlockSize: 4}, {Worker: "b", Model: "m", BlockSize: 4}, {Worker: "c", Model: "other", BlockSize: 4}},
		Tokenizers: map[string]string{"m": dir},
	}
	_, c := start(t, cfg)
	prompt := "The quick brown fox jumps over the lazy dog <|im_end|> again and again."
	promptIDs, _ := m.EncodePrompt(nil, prompt)
	msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a KV cache?"}]`
	chatIDs, _, err := m.EncodeChat(nil, tokenize.Chat{MessagesJSON: []byte(msgs), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	// Worker b is predicted to hold the first blocks of both: the text queries must find them.
	for _, ids := range [][]uint32{promptIDs[:12], chatIDs[:20]} {
		if code := c.do("POST", "/v1/routed", `{"model":"m","worker":"b","tokens":`+idsJSON(ids)+`}`, nil); code != 200 {
			t.Fatalf("routed: %d", code)
		}
	}
	for _, tc := range []struct {
		path, body string
		ids        []uint32
		text       bool // the body carries text, not ids: the answer counts its tokens
	}{
		{"/v1/match", `{"model":"m","prompt":` + quote(prompt) + `}`, promptIDs, true},
		{"/v1/match", `{"model":"m","messages":` + msgs + `}`, chatIDs, true},
		{"/v1/match", `{"model":"m","messages":` + msgs + `,"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}`, chatIDs, true},
		{"/v1/route", `{"model":"m","prompt":` + quote(prompt) + `,"max_tokens":16,"temperature":0.2,"stream":true}`, promptIDs, true},
		{"/v1/route", `{"model":"m","prompt":[` + quote(prompt) + `],"n":1}`, promptIDs, true},
		{"/v1/route", `{"model":"m","prompt":` + idsJSON(promptIDs) + `}`, promptIDs, false},
		{"/v1/route", `{"model":"m","messages":` + msgs + `,"max_completion_tokens":64,"stream_options":{"include_usage":true},"tools":null}`, chatIDs, true},
	} {
		var got, want server.MatchResponse
		if code := c.do("POST", tc.path, tc.body, &got); code != 200 {
			t.Fatalf("%s %.80s: %d", tc.path, tc.body, code)
		}
		if code := c.do("POST", "/v1/match", `{"model":"m","tokens":`+idsJSON(tc.ids)+`}`, &want); code != 200 {
			t.Fatalf("tokens: %d", code)
		}
		if tc.text && got.Tokens != len(tc.ids) {
			t.Errorf("%s %.80s: tokens %d, want %d", tc.path, tc.body, got.Tokens, len(tc.ids))
		}
		got.Tokens = 0
		if got.Pick == nil || got.Pick.Worker != "b" || got.Blocks != len(tc.ids)/4 || !reflect.DeepEqual(got.Matches, want.Matches) || got.Blocks != want.Blocks {
			t.Errorf("%s %.80s:\n got %+v\nwant %+v", tc.path, tc.body, got, want)
		}
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestTextMatchRejects: text queries refused with a reason, before any hashing.
func TestTextMatchRejects(t *testing.T) {
	cfg := server.Config{
		Listen:     "127.0.0.1:0",
		Engines:    []server.EngineConfig{{Worker: "a", Model: "m", BlockSize: 4}, {Worker: "c", Model: "other", BlockSize: 4}},
		Tokenizers: map[string]string{"m": tokoracle.TinyModel(t)},
	}
	_, c := start(t, cfg)
	for _, tc := range []struct{ path, body, code string }{
		{"/v1/match", `{"model":"other","prompt":"hi"}`, "no_tokenizer"},
		{"/v1/match", `{"model":"m","prompt":"hi","tokens":[1,2,3,4]}`, "bad_query"},
		{"/v1/match", `{"model":"m","prompt":"hi","messages":[]}`, "bad_query"},
		{"/v1/match", `{"model":"m","prompt":"hi","add_generation_prompt":true}`, "bad_query"},
		{"/v1/match", `{"model":"m","tools":[]}`, "bad_query"},
		{"/v1/match", `{"model":"m","prompt":"hi","extra_keys":[null]}`, "bad_query"},
		{"/v1/match", `{"model":"m","prompt":[1,2]}`, "bad_json"},
		{"/v1/match", `{"model":"m","messages":{"role":"user"}}`, "bad_json"},
		{"/v1/match", `{"model":"m","messages":[],"chat_template_kwargs":[]}`, "bad_json"},
		{"/v1/match", `{"model":"m","prompt":"hi","prompt":"ho"}`, "bad_json"},
		{"/v1/route", `{"model":"m"}`, "bad_query"},
		{"/v1/route", `{"model":"m","prompt":["a","b"]}`, "bad_query"},
		{"/v1/route", `{"model":"m","prompt":{"x":1}}`, "bad_query"},
		{"/v1/route", `{"model":"m","prompt":"a","messages":[]}`, "bad_query"},
		{"/v1/route", `{"model":"m","prompt":"a"} x`, "bad_json"},
		{"/v1/route?pick=maybe", `{"model":"m","prompt":"a"}`, "bad_query"},
		{"/v1/route", `{"model":"nope","prompt":"a"}`, "unknown_model"},
	} {
		var e struct{ Code string }
		if code := c.do("POST", tc.path, tc.body, &e); code != 400 || e.Code != tc.code {
			t.Errorf("%s %s: %d %q, want 400 %q", tc.path, tc.body, code, e.Code, tc.code)
		}
	}
	if _, err := server.New(server.Config{Listen: "127.0.0.1:0", Engines: []server.EngineConfig{{Worker: "a", Model: "m"}},
		Tokenizers: map[string]string{"m": t.TempDir()}}, server.Options{}); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("a folder without tokenizer.json: %v", err)
	}
}

// TestTextRoutingMatchesEngine is the end-to-end check: an engine publishes (over ZMTP,
// as vLLM does) the blocks of a chat and of a prompt tokenized by the reference
// (transformers.js, @huggingface/jinja); the same text routed through serve finds every
// one of them.
func TestTextRoutingMatchesEngine(t *testing.T) {
	if !testsize.Full() {
		t.Skip("a sequential end-to-end comparison with the reference, which the race detector slows 5-10x: make test runs it in the plain build (its plain-index)")
	}
	dir := tokoracle.ModelDir(t, "qwen3")
	msgs := []map[string]any{{"role": "system", "content": "You route requests."}, {"role": "user", "content": "Which worker holds the longest prefix of this conversation? 你好 😀"}}
	prompt := "def f(x):\n    return x ** 2  # the completions prompt, 42 times <|im_start|>"
	ref := tokoracle.Run(t, []tokoracle.Job{{Model: "qwen3", Messages: msgs, AddGenerationPrompt: true}, {Model: "qwen3", Text: prompt, Special: true}}, nil)
	pub, err := fakevllm.ListenPub("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const bs = 4
	cfg := server.Config{
		Listen:     "127.0.0.1:0",
		Engines:    []server.EngineConfig{{Endpoint: "tcp://" + pub.Addr(), Worker: "vllm", Model: "qwen3", BlockSize: bs}, {Worker: "idle", Model: "qwen3", BlockSize: bs}},
		Tokenizers: map[string]string{"qwen3": dir},
	}
	_, c := start(t, cfg)
	for k, ids := range ref.IDs {
		payload := storedBatch(uint64(k)<<32, ids[:len(ids)/bs*bs], bs)
		deadline := time.Now().Add(15 * time.Second)
		for {
			pub.SendPayload(payload)
			var resp server.MatchResponse
			c.do("POST", "/v1/match", `{"model":"qwen3","tokens":`+idsJSON(ids)+`}`, &resp)
			if len(resp.Matches) > 0 && resp.Matches[0].Score == len(ids)/bs {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the engine's blocks never reached the index: %+v", resp)
			}
			time.Sleep(5 * time.Millisecond) // pacing of a bounded probe loop
		}
	}
	msgJSON, _ := json.Marshal(msgs)
	for i, body := range []string{
		`{"model":"qwen3","messages":` + string(msgJSON) + `}`,
		`{"model":"qwen3","prompt":` + quote(prompt) + `}`,
	} {
		for _, path := range []string{"/v1/match", "/v1/route"} {
			var resp server.MatchResponse
			if code := c.do("POST", path, body, &resp); code != 200 {
				t.Fatalf("%s: %d", path, code)
			}
			want := len(ref.IDs[i]) / bs
			if resp.Tokens != len(ref.IDs[i]) || resp.Blocks != want || resp.Pick == nil || resp.Pick.Worker != "vllm" || resp.Matches[0].Score != want {
				t.Errorf("%s %.60s: %+v, want all %d blocks on vllm (%d tokens)", path, body, resp, want, len(ref.IDs[i]))
			}
		}
	}
}

// storedBatch is a vLLM KV-event batch storing tokens in blocks of bs (engine block
// hashes base+1, base+2, ...).
func storedBatch(base uint64, tokens []uint32, bs int) []byte {
	n := len(tokens) / bs
	e := fakevllm.Enc{}.Arr(3).F64(1750000000).Arr(1).Arr(8).Str("BlockStored").Arr(n)
	for i := range n {
		e = e.Uint(base + uint64(i) + 1)
	}
	e = e.Nil().Tokens(tokens).Uint(uint64(bs)).Nil().Str("GPU").Nil()
	return e.Uint(0)
}

// TestGRPCTextMatch: gRPC Match takes the same text (prompt, messages_json) and answers
// as for its token ids.
func TestGRPCTextMatch(t *testing.T) {
	dir := tokoracle.TinyModel(t)
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	f := startGRPC(t, server.Config{Models: map[string]int{"m": 4}, Tokenizers: map[string]string{"m": dir}})
	prompt := "Route me to the worker that holds this prompt's prefix."
	promptIDs, _ := m.EncodePrompt(nil, prompt)
	msgs := `[{"role":"user","content":"Route me"}]`
	chatIDs, _, err := m.EncodeChat(nil, tokenize.Chat{MessagesJSON: []byte(msgs), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][]uint32{promptIDs, chatIDs} {
		if code := f.http.do("POST", "/v1/routed", `{"model":"m","worker":"w1","tokens":`+idsJSON(ids)+`}`, nil); code != 200 {
			t.Fatalf("routed: %d", code)
		}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		req *kvindexv1.MatchRequest
		ids []uint32
	}{
		{&kvindexv1.MatchRequest{Model: "m", Prompt: &prompt}, promptIDs},
		{&kvindexv1.MatchRequest{Model: "m", MessagesJson: msgs}, chatIDs},
	} {
		got := must(f.grpc.Match(ctx, tc.req))
		want := must(f.grpc.Match(ctx, &kvindexv1.MatchRequest{Model: "m", Tokens: tc.ids}))
		if int(got.Tokens) != len(tc.ids) || got.Blocks != want.Blocks || got.Pick == nil || got.Pick.Worker != "w1" ||
			len(got.Matches) != 1 || got.Matches[0].Score != want.Matches[0].Score {
			t.Errorf("%v: %v, want %v", tc.req, got, want)
		}
	}
	no := false
	for _, req := range []*kvindexv1.MatchRequest{
		{Model: "m", MessagesJson: `{"role":"user"}`},
		{Model: "m", Prompt: &prompt, MessagesJson: msgs},
		{Model: "m", Prompt: &prompt, AddGenerationPrompt: &no},
		{Model: "m", MessagesJson: msgs, ChatTemplateKwargsJson: "[]"},
	} {
		if _, err := f.grpc.Match(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
}
