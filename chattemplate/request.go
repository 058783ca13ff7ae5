package chattemplate

import (
	"errors"
	"fmt"
)

// FromRequest builds the template context vLLM builds from an OpenAI chat-completions
// request body (vllm/entrypoints/chat_utils.py parse_chat_messages with the "string"
// content format that Qwen3's and Llama 3.1's templates use, then serving_chat's
// tools and chat_template_kwargs):
//
//   - each message becomes {role, content, ...} with content a string: null is "", a list
//     of parts is its text parts ("text", "input_text", "output_text", "thinking" and
//     "refusal" parts, or plain strings) joined with "\n";
//   - an assistant message keeps tool_calls (an empty list is dropped), each call's
//     function.arguments parsed from its JSON string ("" or null become {}), and its
//     reasoning (or the deprecated reasoning_content) under both "reasoning" and
//     "reasoning_content"; a tool message keeps tool_call_id; any message keeps a string
//     name; a developer message keeps tools;
//   - each tool is {"type": "function", "function": {"name", "description",
//     "parameters"}} as pydantic's model_dump writes it: absent fields are null, extra
//     fields follow in request order;
//   - add_generation_prompt defaults to true; chat_template_kwargs become Extra.
//
// Key order is the request's. The model, sampling and other fields are ignored.
// Multimodal parts are an error (their placeholders are model-specific), and so is
// continue_final_message (vLLM cuts the rendered text after the final message).
func FromRequest(body []byte) (Context, error) {
	var ctx Context
	v, err := DecodeJSON(body)
	if err != nil {
		return ctx, err
	}
	req, ok := v.(*Dict)
	if !ok {
		return ctx, errors.New("chattemplate: request body is not a JSON object")
	}
	msgs, err := requestMessages(req)
	if err != nil {
		return ctx, err
	}
	ctx.messages, ctx.fromRequest = msgs, true
	if ctx.tools, err = requestTools(req); err != nil {
		return ctx, err
	}
	ctx.AddGenerationPrompt = true
	if agp, ok := req.Get("add_generation_prompt"); ok && agp != nil {
		b, isBool := agp.(bool)
		if !isBool {
			return ctx, errors.New("chattemplate: add_generation_prompt must be a boolean")
		}
		ctx.AddGenerationPrompt = b
	}
	if c, _ := req.Get("continue_final_message"); truthy(c) {
		return ctx, errors.New("chattemplate: continue_final_message is not supported")
	}
	if kw, ok := req.Get("chat_template_kwargs"); ok && kw != nil {
		d, isDict := kw.(*Dict)
		if !isDict {
			return ctx, errors.New("chattemplate: chat_template_kwargs must be an object")
		}
		ctx.Extra = make(map[string]any, d.Len())
		for i, k := range d.keys {
			ctx.Extra[k] = d.vals[i]
		}
	}
	return ctx, nil
}

func requestMessages(req *Dict) ([]any, error) {
	raw, _ := req.Get("messages")
	list, ok := raw.([]any)
	if !ok {
		return nil, errors.New("chattemplate: messages must be a JSON array")
	}
	out := make([]any, len(list))
	for i, m := range list {
		d, ok := m.(*Dict)
		if !ok {
			return nil, fmt.Errorf("chattemplate: messages[%d] is not an object", i)
		}
		msg, err := requestMessage(d)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: messages[%d]: %w", i, err)
		}
		out[i] = msg
	}
	return out, nil
}

// requestMessage is vLLM's _parse_chat_message_content and _postprocess_messages for one
// message.
func requestMessage(m *Dict) (*Dict, error) {
	roleV, _ := m.Get("role")
	role, ok := roleV.(string)
	if !ok {
		return nil, errors.New("role must be a string")
	}
	content, _ := m.Get("content")
	text, err := contentText(content)
	if err != nil {
		return nil, err
	}
	out := NewDict()
	out.Set("role", role)
	out.Set("content", text)
	switch role {
	case "assistant":
		if calls, ok := m.Get("tool_calls"); ok && calls != nil {
			if err := setToolCalls(out, calls); err != nil {
				return nil, err
			}
		}
		reasoning, _ := m.Get("reasoning")
		if reasoning == nil {
			reasoning, _ = m.Get("reasoning_content")
		}
		if reasoning != nil {
			out.Set("reasoning", reasoning)
			out.Set("reasoning_content", reasoning)
		}
	case "tool":
		if id, ok := m.Get("tool_call_id"); ok {
			out.Set("tool_call_id", id)
		}
	}
	if name, ok := m.Get("name"); ok {
		if s, isStr := name.(string); isStr {
			out.Set("name", s)
		}
	}
	if role == "developer" {
		tools, _ := m.Get("tools")
		out.Set("tools", tools)
	}
	return out, nil
}

// contentText flattens a message's content the way the "string" content format does.
func contentText(content any) (string, error) {
	switch c := content.(type) {
	case nil:
		return "", nil
	case string:
		return c, nil
	case []any:
		text := ""
		n := 0
		for i, p := range c {
			s, keep, err := partText(p)
			if err != nil {
				return "", fmt.Errorf("content[%d]: %w", i, err)
			}
			if !keep {
				continue
			}
			if n > 0 {
				text += "\n"
			}
			text += s
			n++
		}
		return text, nil
	}
	return "", errors.New("content must be a string, null or a list of parts")
}

func partText(p any) (string, bool, error) {
	if s, ok := p.(string); ok {
		return s, true, nil
	}
	d, ok := p.(*Dict)
	if !ok {
		return "", false, errors.New("a content part must be an object or a string")
	}
	typ, _ := d.Get("type")
	key := "text"
	switch typ {
	case "text", "input_text", "output_text", "thinking":
	case "refusal":
		key = "refusal"
		if _, has := d.Get(key); !has {
			key = "text"
		}
	default:
		return "", false, fmt.Errorf("content part of type %q is not supported (only text parts)", typ)
	}
	v, _ := d.Get(key)
	if v == nil {
		return "", false, nil // vLLM skips a text part without text
	}
	s, ok := v.(string)
	if !ok {
		return "", false, fmt.Errorf("content part %q must be a string", key)
	}
	return s, true, nil
}

// setToolCalls keeps an assistant's tool calls with their arguments parsed.
func setToolCalls(out *Dict, calls any) error {
	list, ok := calls.([]any)
	if !ok {
		out.Set("tool_calls", calls) // vLLM passes a non-list through untouched
		return nil
	}
	if len(list) == 0 {
		return nil
	}
	for i, c := range list {
		call, ok := c.(*Dict)
		if !ok {
			return fmt.Errorf("tool_calls[%d] is not an object", i)
		}
		fv, _ := call.Get("function")
		fn, ok := fv.(*Dict)
		if !ok {
			return fmt.Errorf("tool_calls[%d].function is not an object", i)
		}
		args, _ := fn.Get("arguments")
		switch a := args.(type) {
		case *Dict, []any:
		case string:
			if a == "" {
				fn.Set("arguments", NewDict())
				continue
			}
			parsed, err := DecodeJSON([]byte(a))
			if err != nil {
				return fmt.Errorf("tool_calls[%d].function.arguments: %w", i, err)
			}
			fn.Set("arguments", parsed)
		default:
			if truthy(a) {
				return fmt.Errorf("tool_calls[%d].function.arguments must be a JSON string", i)
			}
			fn.Set("arguments", NewDict())
		}
	}
	out.Set("tool_calls", list)
	return nil
}

// requestTools is [tool.model_dump() for tool in request.tools], or nil without tools.
func requestTools(req *Dict) (any, error) {
	raw, _ := req.Get("tools")
	if raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, errors.New("chattemplate: tools must be a JSON array")
	}
	out := make([]any, len(list))
	for i, t := range list {
		d, ok := t.(*Dict)
		if !ok {
			return nil, fmt.Errorf("chattemplate: tools[%d] is not an object", i)
		}
		if typ, has := d.Get("type"); has && typ != "function" {
			return nil, fmt.Errorf("chattemplate: tools[%d]: type %v is not supported", i, typ)
		}
		fv, _ := d.Get("function")
		fn, ok := fv.(*Dict)
		if !ok {
			return nil, fmt.Errorf("chattemplate: tools[%d].function is not an object", i)
		}
		if name, _ := fn.Get("name"); !isString(name) {
			return nil, fmt.Errorf("chattemplate: tools[%d].function.name must be a string", i)
		}
		out[i] = dumpModel(d, []string{"type", "function"}, map[string]any{"type": "function", "function": dumpModel(fn, []string{"name", "description", "parameters"}, nil)})
	}
	return out, nil
}

// dumpModel is pydantic's model_dump of an object validated against a model with the
// given fields: declared fields first (null when absent, or the given override), then the
// extra fields in input order.
func dumpModel(d *Dict, fields []string, override map[string]any) *Dict {
	out := NewDict()
	for _, f := range fields {
		v, ok := override[f]
		if !ok {
			v, _ = d.Get(f)
		}
		out.Set(f, v)
	}
	for i, k := range d.keys {
		if !contains(fields, k) {
			out.Set(k, d.vals[i])
		}
	}
	return out
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}
