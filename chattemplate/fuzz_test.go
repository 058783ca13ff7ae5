package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzTemplate: any source either fails to parse with an *Error, or renders within its
// bounds (or fails with an *Error); never a panic, never more output than MaxOutput.
func FuzzTemplate(f *testing.F) {
	raw, err := os.ReadFile(filepath.Join("testdata", "probes.json"))
	if err != nil {
		f.Fatal(err)
	}
	var probes [][3]json.RawMessage
	if err := json.Unmarshal(raw, &probes); err != nil {
		f.Fatal(err)
	}
	for _, p := range probes {
		var src string
		if err := json.Unmarshal(p[1], &src); err != nil {
			f.Fatal(err)
		}
		f.Add(src)
	}
	f.Add(benchChatML)
	f.Add("{% macro m(a, b=1) %}{{ caller() }}{{ a ~ b }}{% endmacro %}{% call m(2) %}x{% endcall %}")
	f.Add("{%- raw -%} {{ x }} {%- endraw %}\n{% generation %}y{% endgeneration %}")
	const maxOutput = 1 << 14
	msgs := []map[string]any{
		{"role": "system", "content": "s"},
		{"role": "user", "content": "u", "tool_calls": []any{map[string]any{"function": map[string]any{"name": "f", "arguments": map[string]any{"a": 1}}}}},
	}
	f.Fuzz(func(t *testing.T, src string) {
		tp, err := New(Config{Source: src, MaxSteps: 20000, MaxOutput: maxOutput})
		if err != nil {
			var te *Error
			if !errors.As(err, &te) && len(src) <= MaxSourceBytes && utf8Valid(src) {
				t.Fatalf("New: error %v is not an *Error", err)
			}
			return
		}
		out, err := tp.Render(Context{Messages: msgs, AddGenerationPrompt: true, BOSToken: "<s>", Extra: map[string]any{"enable_thinking": false}})
		if err != nil {
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("Render: error %v is not an *Error", err)
			}
			return
		}
		if len(out) > maxOutput {
			t.Fatalf("output of %d bytes exceeds MaxOutput %d", len(out), maxOutput)
		}
	})
}

// FuzzDecodeJSON: DecodeJSON accepts exactly what encoding/json accepts (within its
// nesting bound) and decodes the same values, with object order kept.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"b": 1, "a": [1.5, -0, 2e3, "x\u00e9\ud83d\ude00", null, true]}`, `"\ud800x"`, `[]`, `{"a":{"a":1},"a":2}`, `01`, `1.`, `"\u0000"`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeJSON(data)
		var want any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		werr := dec.Decode(&want)
		if werr == nil && dec.More() {
			werr = errors.New("trailing data")
		}
		if werr == nil {
			if _, e := dec.Token(); e != io.EOF {
				werr = errors.New("trailing data")
			}
		}
		if err != nil && strings.Contains(err.Error(), "nesting deeper") {
			return
		}
		if (err == nil) != (werr == nil) {
			t.Fatalf("DecodeJSON error %v, encoding/json error %v", err, werr)
		}
		if err == nil && !sameJSON(got, want) {
			t.Fatalf("DecodeJSON %#v, encoding/json %#v", got, want)
		}
	})
}

// sameJSON compares a DecodeJSON value with an encoding/json (UseNumber) value.
func sameJSON(got, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		d, ok := got.(*Dict)
		if !ok || d.Len() != len(w) {
			return false
		}
		for k, wv := range w {
			gv, ok := d.Get(k)
			if !ok || !sameJSON(gv, wv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameJSON(g[i], w[i]) {
				return false
			}
		}
		return true
	case json.Number:
		wf, err := w.Float64()
		gf, _, _, ok := number(got)
		return ok && (gf == wf || err != nil)
	}
	return got == want
}

// FuzzFromRequest: any body is a Context or an error, and the Context renders.
func FuzzFromRequest(f *testing.F) {
	f.Add([]byte(`{"messages": [{"role": "assistant", "content": [{"type": "text", "text": "a"}], "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}], "tools": [{"type": "function", "function": {"name": "f"}}], "chat_template_kwargs": {"x": 1}}`))
	tp, err := New(Config{Source: "{{ messages | tojson }}{{ tools | tojson }}{{ add_generation_prompt }}", MaxOutput: 1 << 16})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ctx, err := FromRequest(body)
		if err != nil {
			return
		}
		if _, err := tp.Render(ctx); err != nil && !errors.Is(err, ErrLimit) {
			t.Fatalf("a context from FromRequest does not render: %v", err)
		}
	})
}
