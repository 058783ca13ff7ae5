package chattemplate

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// The conversation corpus of the oracle tests: seeded random chats as vLLM hands them to
// a template (string contents, tool-call arguments parsed to objects or left as strings,
// OpenAI tool definitions), built as JSON text so both engines read the same key order.

// textPieces mix the scripts and traps the corpus covers: ASCII, CJK, emoji with ZWJ and
// skin tones, combining marks, RTL, code, JSON-looking text, quotes and backslashes,
// special-token strings of both models, think tags, whitespace runs (Unicode spaces
// that Python's str.strip and JavaScript's trim agree on).
var textPieces = []string{
	"Hello", "What is the capital of France?", "Paris.", "ok", "thanks!", "x",
	"你好，世界", "日本語のテキストです。", "한국어 문장", "繁體中文測試",
	"😀", "👩‍👩‍👧‍👦", "👍🏽", "🇫🇷", "e\u0301te\u0301", "A\u030a", "ñ", "Ελληνικά", "مرحبا", "שלום",
	"func main() {\n\tfmt.Println(\"hi\")\n}", "```python\nprint('x')\n```", "if (a < b && c > d) { return; }",
	`{"key": "value", "n": [1, 2]}`, `C:\path\to\file`, `"quoted" and 'single'`, "100%", "{{ not a tag }}", "{% raw %}",
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
	"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
	"1234567890", "3.14159", "-42", "0x1F",
	" ", "  ", "\n", "\n\n", "\t", " \n ", "\u00a0", "\u3000", "\u2003", "\r\n",
}

func randText(r *rand.Rand, maxPieces int) string {
	n := r.IntN(maxPieces + 1)
	var b strings.Builder
	for range n {
		b.WriteString(textPieces[r.IntN(len(textPieces))])
		if r.IntN(3) == 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

var argNames = []string{"city", "unit", "query", "limit", "path", "verbose", "options", "zeta", "alpha", "mode", "ids", "名前"}

// jsonObj writes a JSON object with keys in the given (unsorted) order.
func jsonObj(keys []string, vals []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.WriteString(vals[i])
	}
	b.WriteByte('}')
	return b.String()
}

func jsonStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// randArgValue is a JSON value for a tool-call argument. Floats have a fraction (an
// integral float prints as 2.0 in Python but 2 in JavaScript; the oracle cannot agree).
func randArgValue(r *rand.Rand, depth int) string {
	switch k := r.IntN(8); {
	case k == 0:
		return fmt.Sprint(r.IntN(2000) - 1000)
	case k == 1:
		return fmt.Sprintf("%d.%d5", r.IntN(100), r.IntN(10))
	case k == 2:
		return []string{"true", "false", "null"}[r.IntN(3)]
	case k == 3 && depth < 2:
		n := r.IntN(3)
		items := make([]string, n)
		for i := range items {
			items[i] = randArgValue(r, depth+1)
		}
		return "[" + strings.Join(items, ", ") + "]"
	case k == 4 && depth < 2:
		return randArgs(r, depth+1)
	}
	return jsonStr(randText(r, 3))
}

func randArgs(r *rand.Rand, depth int) string {
	perm := r.Perm(len(argNames))
	n := r.IntN(4)
	keys := make([]string, n)
	vals := make([]string, n)
	for i := range n {
		keys[i] = argNames[perm[i]]
		vals[i] = randArgValue(r, depth)
	}
	return jsonObj(keys, vals)
}

var toolNames = []string{"get_weather", "search", "read_file", "run_code", "lookup_user", "翻訳"}

func randTool(r *rand.Rand, name string) string {
	props := make([]string, 0, 3)
	keys := make([]string, 0, 3)
	for _, i := range r.Perm(len(argNames))[:r.IntN(4)] {
		keys = append(keys, argNames[i])
		typ := []string{"string", "integer", "number", "boolean", "array", "object"}[r.IntN(6)]
		prop := jsonObj([]string{"type", "description"}, []string{jsonStr(typ), jsonStr(randText(r, 2))})
		if r.IntN(4) == 0 {
			prop = jsonObj([]string{"type", "enum"}, []string{`"string"`, `["celsius", "fahrenheit"]`})
		}
		props = append(props, prop)
	}
	params := jsonObj([]string{"type", "properties", "required"}, []string{`"object"`, jsonObj(keys, props), `[]`})
	fnKeys := []string{"name", "description", "parameters"}
	fnVals := []string{jsonStr(name), jsonStr(randText(r, 4)), params}
	if r.IntN(5) == 0 { // no description, as some clients send
		fnKeys, fnVals = []string{"name", "parameters"}, []string{jsonStr(name), params}
	}
	return jsonObj([]string{"type", "function"}, []string{`"function"`, jsonObj(fnKeys, fnVals)})
}

// oracleCase is one conversation with its template flags.
type oracleCase struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	// EnableThinking is "", "true" or "false" ("" leaves enable_thinking undefined).
	EnableThinking string `json:"enable_thinking,omitempty"`
}

// message writes a chat message object with role first.
func message(role string, keys []string, vals []string) string {
	return jsonObj(append([]string{"role"}, keys...), append([]string{jsonStr(role)}, vals...))
}

// randConversation builds one chat: an optional system turn, user turns, assistant turns
// (with reasoning_content, inline think blocks, tool calls), tool results, sometimes a
// system turn in the middle, and sometimes ending on an assistant or tool turn.
func randConversation(r *rand.Rand) oracleCase {
	var msgs []string
	if r.IntN(2) == 0 {
		msgs = append(msgs, message("system", []string{"content"}, []string{jsonStr(randText(r, 6))}))
	}
	turns := 1 + r.IntN(6)
	for t := range turns {
		msgs = append(msgs, message("user", []string{"content"}, []string{jsonStr(randText(r, 8))}))
		if t == turns-1 && r.IntN(2) == 0 {
			break // ends on a user turn
		}
		msgs = append(msgs, randAssistant(r)...)
		if r.IntN(12) == 0 {
			msgs = append(msgs, message("system", []string{"content"}, []string{jsonStr(randText(r, 3))}))
		}
	}
	c := oracleCase{Messages: json.RawMessage("[" + strings.Join(msgs, ",") + "]"), Tools: json.RawMessage("null")}
	if r.IntN(2) == 0 {
		n := 1 + r.IntN(3)
		tools := make([]string, n)
		for i := range tools {
			tools[i] = randTool(r, toolNames[r.IntN(len(toolNames))])
		}
		c.Tools = json.RawMessage("[" + strings.Join(tools, ",") + "]")
	}
	c.AddGenerationPrompt = r.IntN(3) != 0
	c.EnableThinking = []string{"", "true", "false"}[r.IntN(3)]
	return c
}

// randAssistant returns an assistant turn, followed by tool results when it calls tools.
func randAssistant(r *rand.Rand) []string {
	content := randText(r, 8)
	switch r.IntN(5) {
	case 0:
		content = "<think>\n" + randText(r, 4) + "\n</think>\n\n" + content
	case 1:
		content = randText(r, 2) + "</think>" + content
	}
	keys := []string{"content"}
	vals := []string{jsonStr(content)}
	if r.IntN(4) == 0 {
		keys = append(keys, "reasoning_content")
		vals = append(vals, jsonStr(randText(r, 5)))
	}
	calls := 0
	if r.IntN(3) == 0 {
		calls = 1 + r.IntN(3)
		list := make([]string, calls)
		for i := range list {
			args := randArgs(r, 0)
			if r.IntN(4) == 0 { // arguments left as a JSON string
				args = jsonStr(args)
			}
			fn := jsonObj([]string{"name", "arguments"}, []string{jsonStr(toolNames[r.IntN(len(toolNames))]), args})
			if r.IntN(6) == 0 { // a bare {name, arguments} call, which Qwen3 also accepts
				list[i] = fn
				continue
			}
			list[i] = jsonObj([]string{"id", "type", "function"}, []string{jsonStr(fmt.Sprintf("call_%d", r.IntN(1e6))), `"function"`, fn})
		}
		keys = append(keys, "tool_calls")
		vals = append(vals, "["+strings.Join(list, ",")+"]")
	}
	out := []string{message("assistant", keys, vals)}
	for i := range calls {
		out = append(out, message("tool", []string{"tool_call_id", "content"}, []string{jsonStr(fmt.Sprintf("call_%d", i)), jsonStr(randText(r, 4))}))
	}
	return out
}

// corpus returns n seeded conversations.
func corpus(seed uint64, n int) []oracleCase {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]oracleCase, n)
	for i := range out {
		out[i] = randConversation(r)
	}
	return out
}

// goContext is the Context the Go side renders a case with, for a model's specials.
func (c oracleCase) goContext(sp Specials) Context {
	ctx := Context{MessagesJSON: c.Messages, AddGenerationPrompt: c.AddGenerationPrompt, BOSToken: sp.BOSToken, EOSToken: sp.EOSToken}
	if string(c.Tools) != "null" {
		ctx.ToolsJSON = c.Tools
	}
	if c.EnableThinking != "" {
		ctx.Extra = map[string]any{"enable_thinking": c.EnableThinking == "true"}
	}
	return ctx
}
