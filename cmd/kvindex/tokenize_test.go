package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/tokoracle"
	"github.com/kvindex/kvindex/tokenize"
)

// runTokenizeCLI runs `kvindex tokenize` with input on stdin and returns its output lines.
func runTokenizeCLI(t *testing.T, input string, args ...string) (int, []string, string) {
	t.Helper()
	tokenizeStdin = strings.NewReader(input)
	defer func() { tokenizeStdin = os.Stdin }()
	code, out, errs := runCLI(t, append([]string{"tokenize"}, args...)...)
	return code, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), errs
}

func TestTokenizeCommand(t *testing.T) {
	dir := tokoracle.TinyModel(t)
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	prompt := "héllo <|im_end|> wörld"
	wantPrompt, _ := m.EncodePrompt(nil, prompt)
	wantChat, text, err := m.EncodeChat(nil, tokenize.Chat{MessagesJSON: []byte(`[{"role":"user","content":"Hi"}]`), AddGenerationPrompt: true})
	if err != nil || text != "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatalf("EncodeChat: %q, %v", text, err)
	}
	input := strings.Join([]string{
		`{"prompt": "` + prompt + `"}`,
		``,
		`{"messages": [{"role": "user", "content": "Hi"}]}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}`,
		`{"prompt": ""}`,
		`not json`,
		`{"prompt": "a", "messages": []}`,
		`{}`,
		`{"prompt": "` + strings.Repeat("x", 300) + `"}`,
		`{"prompt": "last line without a newline"}`,
	}, "\n")
	code, lines, errs := runTokenizeCLI(t, input, "--tokenizer", dir, "--max-line-bytes", "200")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	type result struct {
		IDs   *[]uint32 `json:"ids"`
		Text  *string   `json:"text"`
		Error string    `json:"error"`
	}
	var got []result
	for _, l := range lines {
		var r result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		got = append(got, r)
	}
	if len(got) != 9 {
		t.Fatalf("%d output lines for 9 non-blank inputs: %q", len(got), lines)
	}
	wantNoGen := wantChat[:len(wantChat)-3] // less "<|im_start|>", "a", ... the generation prompt
	wantNoGen, _ = m.Tokenizer.Encode(wantNoGen[:0:0], "<|im_start|>user\nHi<|im_end|>\n", false)
	last, _ := m.EncodePrompt(nil, "last line without a newline")
	checks := []struct {
		ids   []uint32
		text  string
		error string
	}{
		{ids: wantPrompt},
		{ids: wantChat, text: text},
		{ids: wantNoGen, text: "<|im_start|>user\nHi<|im_end|>\n"},
		{ids: []uint32{}},
		{error: "not a JSON object"},
		{error: "not both"},
		{error: "prompt or messages is required"},
		{error: "longer than 200 bytes"},
		{ids: last},
	}
	for i, c := range checks {
		g := got[i]
		switch {
		case c.error != "":
			if !strings.Contains(g.Error, c.error) || g.IDs != nil {
				t.Errorf("line %d: %q, want an error containing %q", i, lines[i], c.error)
			}
		case g.IDs == nil || !slices.Equal(*g.IDs, c.ids) || (c.text != "") != (g.Text != nil) || (g.Text != nil && *g.Text != c.text):
			t.Errorf("line %d: %q, want ids %v text %q", i, lines[i], c.ids, c.text)
		}
	}
}

func TestTokenizeCommandFailures(t *testing.T) {
	if code, _, errs := runTokenizeCLI(t, ""); code != 2 || !strings.Contains(errs, "--tokenizer is required") {
		t.Errorf("no --tokenizer: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runTokenizeCLI(t, "", "--tokenizer", tokoracle.TinyModel(t), "--max-line-bytes", "0"); code != 2 || !strings.Contains(errs, "--max-line-bytes 0") {
		t.Errorf("--max-line-bytes 0: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runTokenizeCLI(t, "", "--tokenizer", t.TempDir()); code != 1 || !strings.Contains(errs, "tokenizer.json") {
		t.Errorf("empty folder: exit %d, stderr %q", code, errs)
	}
}

// TestTokenizeCommandOracle: the command's ids for Qwen3's real folder equal
// transformers.js's, for prompts and for chats.
func TestTokenizeCommandOracle(t *testing.T) {
	dir := tokoracle.ModelDir(t, "qwen3")
	prompts := []string{"Hello, world!", "  x\n\n<|im_start|>user 你好 😀 123456", ""}
	chats := []string{`[{"role":"system","content":"Be brief."},{"role":"user","content":"What's 2+2?"}]`,
		`[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello! How can I help?"},{"role":"user","content":"Tell me a joke 🙂"}]`}
	var jobs []tokoracle.Job
	var input strings.Builder
	for _, p := range prompts {
		jobs = append(jobs, tokoracle.Job{Model: "qwen3", Text: p, Special: true})
		b, _ := json.Marshal(map[string]string{"prompt": p})
		input.Write(append(b, '\n'))
	}
	for _, c := range chats {
		var msgs []map[string]any
		if err := json.Unmarshal([]byte(c), &msgs); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, tokoracle.Job{Model: "qwen3", Messages: msgs, AddGenerationPrompt: true})
		input.WriteString(`{"messages": ` + c + "}\n")
	}
	want := tokoracle.Run(t, jobs, nil)
	code, lines, errs := runTokenizeCLI(t, input.String(), "--tokenizer", dir)
	if code != 0 || len(lines) != len(jobs) {
		t.Fatalf("exit %d, %d lines, stderr %q", code, len(lines), errs)
	}
	for i, l := range lines {
		var r struct {
			IDs  []uint32 `json:"ids"`
			Text string   `json:"text"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.IDs, want.IDs[i]) || (jobs[i].Messages != nil && r.Text != want.Texts[i]) {
			t.Errorf("input %d: got %s\nwant ids %v text %q", i, l, want.IDs[i], want.Texts[i])
		}
	}
}
