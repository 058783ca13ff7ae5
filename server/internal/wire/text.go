package wire

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Text is a request's text fields as its transport decoded them (raw JSON for the
// structured ones; nil when absent).
type Text struct {
	Prompt                   string
	HasPrompt                bool
	Messages, Tools, Kwargs  []byte
	AddGeneration, HasAddGen bool
}

// given says whether the request carries text.
func (t *Text) Given() bool { return t.HasPrompt || t.Messages != nil }

// decodeTextField reads the value of text field key at b[i:] into *t and returns the
// offset after it.
func decodeTextField(key string, b []byte, i int, t *Text) (int, error) {
	if hasPrefix(b[i:], "null") {
		return i + 4, nil
	}
	switch key {
	case "prompt":
		end, err := scanString(b, i)
		if err != nil || b[i] != '"' {
			return i, errors.New("prompt: want a string (token ids go in tokens)")
		}
		if t.Prompt, err = stringValue(b[i:end]); err != nil {
			return i, fmt.Errorf("prompt: %w", err)
		}
		t.HasPrompt = true
		return end, nil
	case "add_generation_prompt":
		switch {
		case hasPrefix(b[i:], "true"):
			t.AddGeneration, t.HasAddGen = true, true
			return i + 4, nil
		case hasPrefix(b[i:], "false"):
			t.HasAddGen = true
			return i + 5, nil
		}
		return i, errors.New("add_generation_prompt: want true or false")
	}
	end, err := scanValue(b, i)
	if err != nil {
		return i, fmt.Errorf("%s: %w", key, err)
	}
	raw := b[i:end]
	if err := CheckTextJSON(key, raw); err != nil {
		return i, err
	}
	switch key {
	case "messages":
		t.Messages = raw
	case "tools":
		t.Tools = raw
	default:
		t.Kwargs = raw
	}
	return end, nil
}

// CheckTextJSON checks the shape of a structured text field: messages and tools are
// arrays, chat_template_kwargs an object.
func CheckTextJSON(key string, raw []byte) error {
	open, what := byte('['), "an array"
	if key == "chat_template_kwargs" {
		open, what = '{', "an object"
	}
	if len(raw) == 0 || raw[0] != open || !json.Valid(raw) {
		return fmt.Errorf("%s: want null or %s", key, what)
	}
	return nil
}
