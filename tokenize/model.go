package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvindex/kvindex/chattemplate"
)

// Model is a model folder's tokenizer and chat template: what turns an OpenAI request
// (a completions prompt or chat messages) into the token ids vLLM computes for it.
// Immutable after LoadModel; safe for concurrent use.
type Model struct {
	Tokenizer *Tokenizer
	// Template is nil when the folder has no chat template (prompts only).
	Template *chattemplate.Template
	Specials chattemplate.Specials
}

// ModelConfig says where a Model comes from. Zero values mean the defaults.
type ModelConfig struct {
	// Dir is the model folder: tokenizer.json, tokenizer_config.json, and optionally
	// chat_template.jinja (which wins over the config's chat_template, as in transformers).
	Dir string
	// TemplateName picks a named template when tokenizer_config.json has several
	// ("" is "default").
	TemplateName string
	// Tokenizer and Template carry the limits (their Dir and Source are ignored).
	Tokenizer Config
	Template  chattemplate.Config
}

// LoadModel loads a model folder. A folder without a chat template loads (Chat then
// fails); any other template error is returned.
func LoadModel(cfg ModelConfig) (*Model, error) {
	tc := cfg.Tokenizer
	tc.Dir, tc.TokenizerJSON = cfg.Dir, nil
	tok, err := New(tc)
	if err != nil {
		return nil, err
	}
	m := &Model{Tokenizer: tok}
	tmpl, sp, err := chattemplate.LoadDirNamed(cfg.Dir, cfg.TemplateName, cfg.Template)
	if err != nil && hasTemplate(cfg.Dir) {
		return nil, err
	}
	m.Template, m.Specials = tmpl, sp
	return m, nil
}

// hasTemplate says whether dir offers a chat template at all (chat_template.jinja, or a
// non-null chat_template in tokenizer_config.json).
func hasTemplate(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return true
	}
	b, err := readBounded(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return false
	}
	var c struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	return json.Unmarshal(b, &c) == nil && !isNull(c.ChatTemplate)
}

// Chat is a chat completions request's part that reaches the template.
type Chat struct {
	// MessagesJSON and ToolsJSON are the request's "messages" and "tools" arrays as
	// received (their key order reaches templates that print them with tojson).
	MessagesJSON, ToolsJSON []byte
	// AddGenerationPrompt is the request's add_generation_prompt (vLLM's default: true).
	AddGenerationPrompt bool
	// Kwargs is the request's chat_template_kwargs (enable_thinking, ...).
	Kwargs map[string]any
}

// EncodePrompt appends a completions prompt's ids to dst: the tokenizer's own special
// tokens included, as vLLM encodes it.
func (m *Model) EncodePrompt(dst []uint32, prompt string) ([]uint32, error) {
	return m.Tokenizer.Encode(dst, prompt, true)
}

// EncodeChat renders a chat with the model's template and appends its ids to dst,
// without adding special tokens again (the template wrote them), as vLLM does. It
// returns the rendered text too.
func (m *Model) EncodeChat(dst []uint32, c Chat) ([]uint32, string, error) {
	if m.Template == nil {
		return dst, "", errors.New("tokenize: the model folder has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)")
	}
	text, err := m.Template.Render(chattemplate.Context{
		MessagesJSON:        c.MessagesJSON,
		ToolsJSON:           c.ToolsJSON,
		AddGenerationPrompt: c.AddGenerationPrompt,
		BOSToken:            m.Specials.BOSToken,
		EOSToken:            m.Specials.EOSToken,
		Extra:               c.Kwargs,
	})
	if err != nil {
		return dst, "", fmt.Errorf("chat template: %w", err)
	}
	dst, err = m.Tokenizer.Encode(dst, text, false)
	return dst, text, err
}
