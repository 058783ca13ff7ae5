package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Specials are the special tokens a model folder's tokenizer_config.json names; vLLM
// passes bos_token and eos_token to the template (transformers' special_tokens_map).
// An absent or null token is "".
type Specials struct {
	BOSToken, EOSToken, UnkToken, PadToken string
	// TemplateName is the named template LoadDir picked ("" for a single template).
	TemplateName string
	// TemplateNames lists the named templates the folder offers, in file order.
	TemplateNames []string
}

// maxConfigBytes bounds tokenizer_config.json (Qwen3's is 9 KiB; some carry the whole
// added-token table, a few hundred KiB).
const maxConfigBytes = 16 << 20

// LoadDir loads a model folder's chat template and special tokens with default limits,
// picking the template named "default" when there are several. See LoadDirNamed.
func LoadDir(dir string) (*Template, Specials, error) {
	return LoadDirNamed(dir, "", Config{})
}

// LoadDirNamed loads a model folder's chat template as transformers does:
// chat_template.jinja when present, else tokenizer_config.json's "chat_template", which
// is a string or a list of {"name", "template"} (name "" picks "default"). cfg.Source is
// replaced by the template found; its limits apply.
func LoadDirNamed(dir, name string, cfg Config) (*Template, Specials, error) {
	var sp Specials
	conf, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, sp, err
	}
	sp.BOSToken = tokenString(conf["bos_token"])
	sp.EOSToken = tokenString(conf["eos_token"])
	sp.UnkToken = tokenString(conf["unk_token"])
	sp.PadToken = tokenString(conf["pad_token"])
	src, err := readLimited(filepath.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		if src, err = pickTemplate(conf["chat_template"], name, &sp); err != nil {
			return nil, sp, fmt.Errorf("chattemplate: %s: %w", dir, err)
		}
	default:
		return nil, sp, fmt.Errorf("chattemplate: %w", err)
	}
	cfg.Source = src
	t, err := New(cfg)
	if err != nil {
		return nil, sp, fmt.Errorf("chattemplate: %s: %w", dir, err)
	}
	return t, sp, nil
}

func readLimited(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxConfigBytes {
		return "", fmt.Errorf("%s is larger than %d bytes", path, maxConfigBytes)
	}
	return string(b), nil
}

func readConfig(path string) (map[string]json.RawMessage, error) {
	b, err := readLimited(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	var conf map[string]json.RawMessage
	if err := json.Unmarshal([]byte(b), &conf); err != nil {
		return nil, fmt.Errorf("chattemplate: %s: %w", path, err)
	}
	return conf, nil
}

// tokenString reads a special token written as a string or as an AddedToken object.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var tok struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &tok) == nil {
		return tok.Content
	}
	return ""
}

func pickTemplate(raw json.RawMessage, name string, sp *Specials) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("no chat_template in tokenizer_config.json and no chat_template.jinja")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of named templates: %w", err)
	}
	if name == "" {
		name = "default"
	}
	for _, n := range named {
		sp.TemplateNames = append(sp.TemplateNames, n.Name)
	}
	for _, n := range named {
		if n.Name == name {
			sp.TemplateName = name
			return n.Template, nil
		}
	}
	return "", fmt.Errorf("no chat template named %q (have %q)", name, sp.TemplateNames)
}
