package chattemplate

import (
	"strings"
	"testing"
)

// TestFromRequest: an OpenAI request body reaches the template as vLLM's
// parse_chat_messages and serving_chat hand it over.
func TestFromRequest(t *testing.T) {
	body := `{"model": "m", "temperature": 0.5,
	  "messages": [
	    {"role": "system", "content": [{"type": "text", "text": "a"}, "b", {"type": "text", "text": null}, {"type": "input_text", "text": "c"}]},
	    {"role": "user", "content": "hi", "name": "ann"},
	    {"role": "assistant", "content": null, "reasoning_content": "think",
	     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [true]}"}},
	                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
	    {"role": "tool", "tool_call_id": "c1", "content": "r"},
	    {"role": "assistant", "content": "x", "tool_calls": []}
	  ],
	  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}}],
	  "chat_template_kwargs": {"enable_thinking": false}}`
	ctx, err := FromRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	tp := mustNew(t, Config{Source: "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools | tojson }}|{{ add_generation_prompt }}|{{ enable_thinking }}"})
	out, err := tp.Render(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role": "system", "content": "a\nb\nc"}
{"role": "user", "content": "hi", "name": "ann"}
{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": [true]}}}, {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {}}}], "reasoning": "think", "reasoning_content": "think"}
{"role": "tool", "content": "r", "tool_call_id": "c1"}
{"role": "assistant", "content": "x"}
[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}, "strict": true}}]|True|False`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	ctx, err = FromRequest([]byte(`{"messages": [], "add_generation_prompt": false}`))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := mustNew(t, Config{Source: "{{ tools is none }}{{ add_generation_prompt }}{{ messages | length }}"}).Render(ctx); err != nil || out != "TrueFalse0" {
		t.Errorf("defaults: %q, %v", out, err)
	}
}

func TestFromRequestErrors(t *testing.T) {
	for _, body := range []string{
		`[]`, `{}`, `{"messages": {}}`, `{"messages": [1]}`, `{"messages": [{"content": "x"}]}`,
		`{"messages": [{"role": "user", "content": 5}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`,
		`{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]}`,
		`{"messages": [], "tools": [{"type": "custom", "custom": {}}]}`,
		`{"messages": [], "tools": [{"type": "function", "function": {"description": "no name"}}]}`,
		`{"messages": [], "continue_final_message": true}`,
		`{"messages": [], "add_generation_prompt": "yes"}`,
		`{"messages": [], "chat_template_kwargs": []}`,
	} {
		if _, err := FromRequest([]byte(body)); err == nil || !strings.HasPrefix(err.Error(), "chattemplate: ") {
			t.Errorf("FromRequest(%s): err %v", body, err)
		}
	}
}
