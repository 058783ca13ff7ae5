package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvindex/kvindex/tokenize"
)

// doctor --tokenize: the most common cause of a router's zero hits is a tokenizer that
// differs from the engine's by one token, after which every block hash differs. vLLM
// serves its own tokenizer at POST /tokenize ({"prompt"} or {"messages"} in, {"tokens"}
// out); this check sends it probe texts and compares its ids with the model folder's,
// naming the first position where they part.

const tokenizeURLHelp = "with --tokenizer: an engine's HTTP base URL (vLLM's OpenAI server, e.g. http://vllm:8000): compare its /tokenize with the model folder's ids"

// maxTokenizeAnswer bounds one /tokenize answer.
const maxTokenizeAnswer = 64 << 20

// doctorProbes are the texts sent: the shapes tokenizers disagree on.
var doctorProbes = []string{
	"Hello, world! It's a KV-cache router; we're routing 1,234,567 requests.",
	"  indented\tcode:\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i)\n\t}\n\n\n",
	"你好，世界。こんにちは 안녕하세요 😀👍🏽 👨‍👩‍👧‍👦 café naïve e\u0301",
	"<|im_start|>user\nspecial-token strings inside text<|im_end|> <|begin_of_text|> <s> </s>",
	"1234567890 3.14159 2026-12-06 +1 (555) 010-9999   \u00a0\u3000 trailing   ",
}

// doctorChat is the chat probe (rendered by both sides' templates).
const doctorChat = `[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is a KV cache? Answer in one sentence."}]`

func doctorTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("doctor", stderr)
	base := fs.String("tokenize", "", tokenizeURLHelp)
	dir := fs.String("tokenizer", "", tokenizerHelp)
	model := fs.String("model", "", "with --tokenize: the model name the engine serves (its request's \"model\"; empty: none sent)")
	var texts textFlags
	fs.Var(&texts, "text", "with --tokenize: a probe text of your own (repeatable; the built-in probes and a chat are sent too)")
	timeout := fs.Duration("timeout", 10*time.Second, "with --tokenize: bound on each request")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	u, err := url.Parse(*base)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return exitCode(stderr, "doctor", usageErr("--tokenize %q: want an http(s) URL", *base))
	case *dir == "":
		return exitCode(stderr, "doctor", usageErr("--tokenize needs --tokenizer DIR"))
	case *timeout <= 0:
		return exitCode(stderr, "doctor", usageErr("--timeout must be positive"))
	}
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: *dir})
	if err != nil {
		return exitCode(stderr, "doctor", err)
	}
	c := &tokenizeClient{url: strings.TrimSuffix(*base, "/") + "/tokenize", model: *model, hc: &http.Client{Timeout: *timeout}}
	differ := 0
	for _, p := range append(append([]string(nil), doctorProbes...), texts...) {
		differ += c.check(ctx, stdout, m, p, "")
	}
	if m.Template != nil {
		differ += c.check(ctx, stdout, m, "", doctorChat)
	}
	if differ > 0 {
		fmt.Fprintf(stdout, "%d of the probes differ: the router's block hashes part from the engine's at the first difference; use the engine's own tokenizer.json, tokenizer_config.json and chat template\n", differ)
		return 1
	}
	fmt.Fprintln(stdout, "every probe tokenizes as the engine does")
	return 0
}

type textFlags []string

func (t *textFlags) String() string     { return strings.Join(*t, " | ") }
func (t *textFlags) Set(s string) error { *t = append(*t, s); return nil }

type tokenizeClient struct {
	url, model string
	hc         *http.Client
}

// check compares one probe (a prompt, or a chat when messages is set) and prints the
// verdict; it returns 1 when the ids differ or the engine cannot answer.
func (c *tokenizeClient) check(ctx context.Context, w io.Writer, m *tokenize.Model, prompt, messages string) int {
	what := fmt.Sprintf("prompt %.40q", prompt)
	var local []uint32
	var err error
	req := map[string]any{}
	if c.model != "" {
		req["model"] = c.model
	}
	if messages != "" {
		what = "chat " + strings.TrimSpace(messages[:min(len(messages), 40)]) + "..."
		local, _, err = m.EncodeChat(nil, tokenize.Chat{MessagesJSON: []byte(messages), AddGenerationPrompt: true})
		req["messages"], req["add_generation_prompt"], req["add_special_tokens"] = json.RawMessage(messages), true, false
	} else {
		local, err = m.EncodePrompt(nil, prompt)
		req["prompt"], req["add_special_tokens"] = prompt, true
	}
	if err != nil {
		fmt.Fprintf(w, "%s: the model folder cannot encode it: %v\n", what, err)
		return 1
	}
	remote, err := c.tokenize(ctx, req)
	if err != nil {
		fmt.Fprintf(w, "%s: %v\n", what, err)
		return 1
	}
	at := firstDifference(local, remote)
	if at < 0 {
		fmt.Fprintf(w, "%s: ok, %d tokens\n", what, len(local))
		return 0
	}
	lo, hi := max(0, at-3), at+4
	fmt.Fprintf(w, "%s: differs at token %d of %d (engine %d): here %v, engine %v\n", what, at, len(local), len(remote),
		local[lo:min(hi, len(local))], remote[lo:min(hi, len(remote))])
	return 1
}

// firstDifference is the first position where a and b differ (a length included), or -1.
func firstDifference(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// tokenize posts one request to the engine's /tokenize and returns its tokens.
func (c *tokenizeClient) tokenize(ctx context.Context, req map[string]any) ([]uint32, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("the engine's /tokenize is unreachable: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeAnswer+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading /tokenize's answer: %w", err)
	case len(b) > maxTokenizeAnswer:
		return nil, fmt.Errorf("/tokenize answered more than %d bytes", maxTokenizeAnswer)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("/tokenize answered %s: %.200s", resp.Status, b)
	}
	var out struct {
		Tokens *[]uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Tokens == nil {
		return nil, errors.Join(errors.New("/tokenize's answer has no \"tokens\" list (is this vLLM's OpenAI server?)"), err)
	}
	return *out.Tokens, nil
}
