package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/tokoracle"
	"github.com/kvindex/kvindex/tokenize"
)

// fakeTokenizeServer answers /tokenize as vLLM's OpenAI server does, from model m; with
// skew, it drops one token of every prompt holding "café" (a tokenizer one token off).
func fakeTokenizeServer(t *testing.T, m *tokenize.Model, skew bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Prompt              *string         `json:"prompt"`
			Messages            json.RawMessage `json:"messages"`
			AddGenerationPrompt bool            `json:"add_generation_prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var ids []uint32
		var err error
		if req.Prompt != nil {
			ids, err = m.EncodePrompt(nil, *req.Prompt)
			if skew && strings.Contains(*req.Prompt, "café") {
				ids = append(ids[:5], ids[6:]...)
			}
		} else {
			ids, _, err = m.EncodeChat(nil, tokenize.Chat{MessagesJSON: req.Messages, AddGenerationPrompt: req.AddGenerationPrompt})
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 4096, "tokens": ids})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDoctorTokenize(t *testing.T) {
	dir := tokoracle.TinyModel(t)
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	same := fakeTokenizeServer(t, m, false)
	code, out, errs := runCLI(t, "doctor", "--tokenize", same.URL, "--tokenizer", dir, "--text", "one more probe")
	if code != 0 || errs != "" || strings.Count(out, ": ok,") != len(doctorProbes)+2 || !strings.Contains(out, "every probe tokenizes as the engine does") {
		t.Fatalf("same tokenizer: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	skewed := fakeTokenizeServer(t, m, true)
	code, out, _ = runCLI(t, "doctor", "--tokenize", skewed.URL+"/", "--tokenizer", dir)
	if code != 1 || !strings.Contains(out, "differs at token 5 of") || !strings.Contains(out, "1 of the probes differ") {
		t.Fatalf("skewed tokenizer: exit %d, stdout %q", code, out)
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	if code, out, _ := runCLI(t, "doctor", "--tokenize", gone.URL, "--tokenizer", dir); code != 1 || !strings.Contains(out, "unreachable") {
		t.Fatalf("unreachable engine: exit %d, stdout %q", code, out)
	}
	notVLLM := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"ok":true}`)) }))
	defer notVLLM.Close()
	if code, out, _ := runCLI(t, "doctor", "--tokenize", notVLLM.URL, "--tokenizer", dir); code != 1 || !strings.Contains(out, `no "tokens" list`) {
		t.Fatalf("not vLLM: exit %d, stdout %q", code, out)
	}
	for _, args := range [][]string{
		{"--tokenize", "ftp://x", "--tokenizer", dir},
		{"--tokenize", same.URL},
		{"--tokenize", same.URL, "--tokenizer", dir, "--timeout", "0s"},
	} {
		if code, _, errs := runCLI(t, append([]string{"doctor"}, args...)...); code != 2 || errs == "" {
			t.Errorf("doctor %v: exit %d, stderr %q; want 2", args, code, errs)
		}
	}
}
