package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/server/internal/wire"
	"github.com/kvindex/kvindex/tokenize"
)

// Text queries: a match request may carry the request's text instead of its token ids,
// "prompt" (a completions prompt) or "messages" (a chat, with "tools",
// "add_generation_prompt" and "chat_template_kwargs"), when the serve config names the
// model's tokenizer folder (Config.Tokenizers). The text is turned into the token ids
// vLLM computes (package tokenize: a prompt with the tokenizer's special tokens, a chat
// rendered by the model's template and encoded without them) at the start of the
// pipeline (textQuery), and everything after is the token query's path: the answer is
// the one the same ids get, plus the number of tokens the text made.
//
// POST /v1/route takes an OpenAI completions or chat completions body unchanged (every
// field this server does not need is ignored) and answers as /v1/match does, with a pick.

// grpcText is a gRPC MatchRequest's text (its shapes are checked by textQuery).
func grpcText(req *kvindexv1.MatchRequest) wire.Text {
	var t wire.Text
	if req.Prompt != nil {
		t.Prompt, t.HasPrompt = *req.Prompt, true
	}
	if req.AddGenerationPrompt != nil {
		t.AddGeneration, t.HasAddGen = *req.AddGenerationPrompt, true
	}
	for _, f := range []struct {
		s   string
		dst *[]byte
	}{{req.GetMessagesJson(), &t.Messages}, {req.GetToolsJson(), &t.Tools}, {req.GetChatTemplateKwargsJson(), &t.Kwargs}} {
		if f.s != "" {
			*f.dst = []byte(f.s)
		}
	}
	return t
}

// loadTokenizers loads Config.Tokenizers' model folders.
func loadTokenizers(dirs map[string]string) (map[string]*tokenize.Model, error) {
	out := make(map[string]*tokenize.Model, len(dirs))
	for name, dir := range dirs {
		m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: dir})
		if err != nil {
			return nil, fmt.Errorf("%w: tokenizers: model %q: %v", ErrConfig, name, err)
		}
		out[name] = m
	}
	return out, nil
}

// textQuery turns a query's text into its token ids (into sc.tokens), so that the rest
// of the pipeline sees a token query. A query without text is left as it is.
func (s *Server) textQuery(m *model, in *queryInput, sc *matchScratch) *apiError {
	t := &in.text
	switch {
	case !t.Given():
		if t.Tools != nil || t.Kwargs != nil || t.HasAddGen {
			return badRequest("bad_query", errors.New("tools, add_generation_prompt and chat_template_kwargs go with messages"))
		}
		return nil
	case t.HasPrompt && t.Messages != nil:
		return badRequest("bad_query", errors.New("give prompt or messages, not both"))
	case in.hasTokens || in.hasHashes:
		return badRequest("bad_query", errors.New("give one of tokens, content_hashes, prompt and messages"))
	case t.HasPrompt && (t.Tools != nil || t.Kwargs != nil || t.HasAddGen):
		return badRequest("bad_query", errors.New("tools, add_generation_prompt and chat_template_kwargs go with messages, not prompt"))
	case in.extraKeys != nil:
		return badRequest("bad_query", errors.New("extra_keys needs tokens (their blocks are counted in token ids)"))
	}
	for _, f := range []struct {
		key string
		raw []byte
	}{{"messages", t.Messages}, {"tools", t.Tools}, {"chat_template_kwargs", t.Kwargs}} {
		if f.raw != nil {
			if err := wire.CheckTextJSON(f.key, f.raw); err != nil {
				return badRequest("bad_query", err)
			}
		}
	}
	tm := s.text[m.name]
	if tm == nil {
		return badRequest("no_tokenizer", fmt.Errorf("model %q has no tokenizer: name its folder in the serve config's tokenizers, or send token ids", m.name))
	}
	var err error
	if t.HasPrompt {
		sc.tokens, err = tm.EncodePrompt(sc.tokens[:0], t.Prompt)
	} else {
		var kwargs map[string]any
		if t.Kwargs != nil {
			if err := json.Unmarshal(t.Kwargs, &kwargs); err != nil {
				return badRequest("bad_messages", fmt.Errorf("chat_template_kwargs: %w", err))
			}
		}
		gen := !t.HasAddGen || t.AddGeneration // vLLM's default: true
		sc.tokens, _, err = tm.EncodeChat(sc.tokens[:0], tokenize.Chat{MessagesJSON: t.Messages, ToolsJSON: t.Tools, AddGenerationPrompt: gen, Kwargs: kwargs})
	}
	if err != nil {
		return badRequest("bad_text", err)
	}
	in.tokens, in.hasTokens = sc.tokens, true
	return nil
}

// openAIRequest is the part of an OpenAI completions or chat completions body that
// routing reads; every other field is ignored.
type openAIRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	CacheSalt           string          `json:"cache_salt"`
}

// handleRoute is POST /v1/route: an OpenAI request body as a gateway received it, routed
// as /v1/match routes its text. Query parameters: policy (as /v1/match's), pick=true
// (count the pick as routed), request_id.
func (s *Server) handleRoute(w http.ResponseWriter, r *http.Request) {
	sc := scratchPool.Get().(*matchScratch)
	defer sc.release()
	sc.body.Reset()
	if !s.readBody(w, r, &sc.body) {
		return
	}
	var body openAIRequest
	if err := json.Unmarshal(sc.body.Bytes(), &body); err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "invalid request: %v", err)
		return
	}
	in := matchInput{queryInput: queryInput{model: body.Model, cacheSalt: body.CacheSalt}, policy: r.URL.Query().Get("policy"), requestID: r.URL.Query().Get("request_id")}
	if p := r.URL.Query().Get("pick"); p != "" {
		v, err := strconv.ParseBool(p)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_query", "pick: want true or false")
			return
		}
		in.pick = v
	}
	if e := openAIQuery(&body, &in.queryInput, sc); e != nil {
		writeAPIError(w, e)
		return
	}
	var resp MatchResponse
	if e := s.match(r.Context(), &in, sc, &resp); e != nil {
		writeAPIError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// openAIQuery fills q's query from an OpenAI body: messages (a chat), or prompt as a
// string, a list of one string, or a list of token ids (vLLM accepts all three).
func openAIQuery(b *openAIRequest, q *queryInput, sc *matchScratch) *apiError {
	hasMsgs, hasPrompt := !isNullJSON(b.Messages), !isNullJSON(b.Prompt)
	switch {
	case hasMsgs && hasPrompt:
		return badRequest("bad_query", errors.New("give prompt (completions) or messages (chat completions), not both"))
	case hasMsgs:
		q.text.Messages = b.Messages
		if !isNullJSON(b.Tools) {
			q.text.Tools = b.Tools
		}
		if !isNullJSON(b.ChatTemplateKwargs) {
			q.text.Kwargs = b.ChatTemplateKwargs
		}
		if b.AddGenerationPrompt != nil {
			q.text.AddGeneration, q.text.HasAddGen = *b.AddGenerationPrompt, true
		}
		return nil
	case !hasPrompt:
		return badRequest("bad_query", errors.New("prompt or messages is required"))
	}
	var one string
	if json.Unmarshal(b.Prompt, &one) == nil {
		q.text.Prompt, q.text.HasPrompt = one, true
		return nil
	}
	var list []string
	if json.Unmarshal(b.Prompt, &list) == nil {
		if len(list) != 1 {
			return badRequest("bad_query", fmt.Errorf("prompt lists %d prompts: route each request on its own", len(list)))
		}
		q.text.Prompt, q.text.HasPrompt = list[0], true
		return nil
	}
	ids := sc.tokens[:0]
	if err := json.Unmarshal(b.Prompt, &ids); err != nil {
		return badRequest("bad_query", errors.New("prompt: want a string, a list of one string, or a list of token ids"))
	}
	sc.tokens = ids
	q.tokens, q.hasTokens = slices.Clip(ids), true
	return nil
}

func isNullJSON(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}
