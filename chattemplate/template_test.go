package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustNew(t testing.TB, cfg Config) *Template {
	t.Helper()
	tp, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", cfg.Source, err)
	}
	return tp
}

func TestConfigBounds(t *testing.T) {
	for _, cfg := range []Config{
		{MaxSteps: -1}, {MaxSteps: MaxMaxSteps + 1}, {MaxOutput: -1}, {MaxOutput: MaxMaxOutput + 1},
		{Source: strings.Repeat("x", MaxSourceBytes+1)}, {Source: "\xff"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New accepted %+v", Config{MaxSteps: cfg.MaxSteps, MaxOutput: cfg.MaxOutput})
		}
	}
	tp := mustNew(t, Config{Source: "x"})
	if tp.cfg.MaxSteps != DefaultMaxSteps || tp.cfg.MaxOutput != DefaultMaxOutput {
		t.Errorf("defaults not applied: %+v", tp.cfg)
	}
}

// TestErrorsNameTheLine: syntax and runtime errors carry the template line.
func TestErrorsNameTheLine(t *testing.T) {
	cases := []struct {
		src  string
		line int
		is   error
	}{
		{"a\nb\n{% if x %}\nc", 3, ErrSyntax},
		{"a\n{{ x + }}", 2, ErrSyntax},
		{"a\n\n{% for x in y %}{% endif %}", 3, ErrSyntax},
		{"{# c\n #}\n{% bogus %}", 3, ErrSyntax},
		{"a\n{{ 'unterminated }}", 2, ErrSyntax},
		{"a\nb\n{{ 1 + 'x' }}", 3, nil},
		{"line1\n{{ raise_exception('bad role') }}", 2, ErrRaised},
		{"{{ undefined_thing.attr }}", 1, nil},
		{"{% for i in range(10) %}\n{% for j in range(10) %}{{ i }}{% endfor %}{% endfor %}", 2, ErrLimit},
	}
	for _, c := range cases {
		tp, err := New(Config{Source: c.src, MaxSteps: 50})
		if err == nil {
			_, err = tp.Render(Context{})
		}
		var te *Error
		if !errors.As(err, &te) {
			t.Errorf("%q: error %v is not an *Error", c.src, err)
			continue
		}
		if te.Line != c.line {
			t.Errorf("%q: line %d, want %d (%v)", c.src, te.Line, c.line, err)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%q: %v is not %v", c.src, err, c.is)
		}
		if !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: message %q does not name the line", c.src, err)
		}
	}
}

// TestLimits: every way a template can loop or grow stops at its bound with ErrLimit.
func TestLimits(t *testing.T) {
	srcs := map[string]string{
		"steps":           "{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
		"output":          "{% for i in range(1000) %}0123456789{% endfor %}",
		"string growth":   "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
		"repeat":          "{{ 'x' * 100000000 }}",
		"list repeat":     "{{ ([1, 2] * 100000000) | length }}",
		"range":           "{{ range(100000000) | length }}",
		"macro recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
		"replace growth":  "{{ ('x' * 1000).replace('x', 'yyyyyyyyyyyy') }}",
	}
	for name, src := range srcs {
		tp := mustNew(t, Config{Source: src, MaxSteps: 5000, MaxOutput: 8000})
		out, err := tp.Render(Context{})
		if !errors.Is(err, ErrLimit) {
			t.Errorf("%s: got %d bytes, err %v; want ErrLimit", name, len(out), err)
		}
	}
	deep := strings.Repeat("(", 10000) + "1" + strings.Repeat(")", 10000)
	if _, err := New(Config{Source: "{{ " + deep + " }}"}); !errors.Is(err, ErrLimit) {
		t.Errorf("deep nesting: %v, want ErrLimit", err)
	}
	blocks := strings.Repeat("{% if true %}", 1000) + strings.Repeat("{% endif %}", 1000)
	if _, err := New(Config{Source: blocks}); !errors.Is(err, ErrLimit) {
		t.Errorf("deep blocks: %v, want ErrLimit", err)
	}
}

// TestGoContext: plain Go maps reach the template with sorted keys; integral float64s
// (encoding/json's numbers) print as integers; unsupported values are errors.
func TestGoContext(t *testing.T) {
	tp := mustNew(t, Config{Source: "{{ messages[0] | tojson }}|{{ tools[0].n }}|{{ bos_token }}{{ eos_token is defined }}|{{ x }}"})
	out, err := tp.Render(Context{
		Messages: []map[string]any{{"role": "user", "content": "hi", "a": []string{"x"}}},
		Tools:    []map[string]any{{"n": 2.0}},
		BOSToken: "<s>",
		Extra:    map[string]any{"x": uint8(7)},
	})
	want := `{"a": ["x"], "content": "hi", "role": "user"}|2|<s>False|7`
	if err != nil || out != want {
		t.Fatalf("got %q, %v; want %q", out, err, want)
	}
	out, err = tp.Render(Context{Messages: []map[string]any{{"z": json.RawMessage(`{"b": 1, "a": 2.5}`)}}, Tools: []map[string]any{{}}, Extra: map[string]any{"x": ""}})
	if want := `{"z": {"b": 1, "a": 2.5}}||False|`; err != nil || out != want {
		t.Errorf("json.RawMessage: got %q, %v; want %q", out, err, want)
	}
	if _, err := tp.Render(Context{Extra: map[string]any{"x": make(chan int)}}); err == nil {
		t.Error("a channel in the context was accepted")
	}
	d := NewDict()
	d.Set("z", int64(1))
	d.Set("a", "b")
	out, err = mustNew(t, Config{Source: "{{ d | tojson }}"}).Render(Context{Extra: map[string]any{"d": d}})
	if err != nil || out != `{"z": 1, "a": "b"}` {
		t.Errorf("Dict order lost: %q, %v", out, err)
	}
}

func TestDecodeJSON(t *testing.T) {
	v, err := DecodeJSON([]byte(`{"b": 1, "a": [1.0, 2, "x", null, true], "c": {"y": 1e3}}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := mustNew(t, Config{Source: "{{ v | tojson }}"}).Render(Context{Extra: map[string]any{"v": v}})
	if want := `{"b": 1, "a": [1.0, 2, "x", null, true], "c": {"y": 1000.0}}`; err != nil || out != want {
		t.Errorf("got %q, %v; want %q", out, err, want)
	}
	for _, bad := range []string{`{`, `[1] 2`, strings.Repeat("[", 200) + strings.Repeat("]", 200)} {
		if _, err := DecodeJSON([]byte(bad)); err == nil {
			t.Errorf("DecodeJSON(%.20q) accepted", bad)
		}
	}
}

func TestStrftimeNow(t *testing.T) {
	now := time.Date(2026, 7, 4, 15, 4, 5, 0, time.UTC)
	out, err := mustNew(t, Config{Source: `{{ strftime_now("%d %b %Y %H:%M:%S %A %B %j %I%p %%") }}`}).Render(Context{Now: now})
	if want := "04 Jul 2026 15:04:05 Saturday July 185 03PM %"; err != nil || out != want {
		t.Errorf("got %q, %v; want %q", out, err, want)
	}
}

func writeFile(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
		"chat_template": [{"name": "default", "template": "D{{ bos_token }}"}, {"name": "tool_use", "template": "T"}]}`)
	tp, sp, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if sp.BOSToken != "<s>" || sp.EOSToken != "</s>" || sp.PadToken != "" || sp.TemplateName != "default" || len(sp.TemplateNames) != 2 {
		t.Errorf("specials %+v", sp)
	}
	if out, err := tp.Render(Context{BOSToken: sp.BOSToken}); err != nil || out != "D<s>" {
		t.Errorf("default template rendered %q, %v", out, err)
	}
	tp, _, err = LoadDirNamed(dir, "tool_use", Config{})
	if out, _ := tp.Render(Context{}); err != nil || out != "T" {
		t.Errorf("tool_use template: %q, %v", out, err)
	}
	if _, _, err := LoadDirNamed(dir, "missing", Config{}); err == nil {
		t.Error("a missing template name was accepted")
	}
	writeFile(t, dir, "chat_template.jinja", "J{{ eos_token }}\n")
	tp, _, err = LoadDir(dir)
	if out, _ := tp.Render(Context{EOSToken: "</s>"}); err != nil || out != "J</s>" {
		t.Errorf("chat_template.jinja: %q, %v", out, err)
	}
	empty := t.TempDir()
	writeFile(t, empty, "tokenizer_config.json", `{"eos_token": "x"}`)
	if _, _, err := LoadDir(empty); err == nil {
		t.Error("a folder without a template was accepted")
	}
}

// TestConcurrentRender: one Template renders on many goroutines (run with -race).
func TestConcurrentRender(t *testing.T) {
	tp := mustNew(t, Config{Source: "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}"})
	done := make(chan string, 8)
	for i := range 8 {
		go func() {
			out, err := tp.Render(Context{Messages: []map[string]any{{"content": strings.Repeat("x", i)}}})
			if err != nil {
				out = err.Error()
			}
			done <- out
		}()
	}
	for range 8 {
		out := <-done
		if !strings.HasSuffix(out, "1") || strings.Trim(out[:len(out)-1], "x") != "" {
			t.Errorf("got %q", out)
		}
	}
}
