package chattemplate

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/cputime"
)

// benchChatML is a small ChatML template (the shape of Qwen2.5's without tools), so one
// benchmark runs without the npm oracle.
const benchChatML = `{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content | trim + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}`

// benchChat is the benchmark's conversation: a system prompt, then 20 turns (a user
// message and an assistant answer each, 100 to 200 bytes of mixed text), two tools, and
// add_generation_prompt.
func benchChat() oracleCase {
	msgs := []string{message("system", []string{"content"}, []string{jsonStr("You are a helpful assistant. Answer briefly; use the tools when they help.")})}
	for i := range 20 {
		user := fmt.Sprintf("Question %d: what is the weather in Paris, and how do I say 'thank you' in Japanese? 你好，世界 😀", i)
		answer := fmt.Sprintf("<think>\nThe user asks two things (turn %d).\n</think>\n\nIt is 21°C and sunny in Paris. In Japanese: ありがとう (arigatou).", i)
		msgs = append(msgs,
			message("user", []string{"content"}, []string{jsonStr(user)}),
			message("assistant", []string{"content"}, []string{jsonStr(answer)}))
	}
	tool := func(name string) string {
		return jsonObj([]string{"type", "function"}, []string{`"function"`, jsonObj([]string{"name", "description", "parameters"}, []string{
			jsonStr(name), jsonStr("Looks things up."),
			`{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}`,
		})})
	}
	return oracleCase{
		Messages:            json.RawMessage("[" + strings.Join(msgs, ",") + "]"),
		Tools:               json.RawMessage("[" + tool("get_weather") + "," + tool("translate") + "]"),
		AddGenerationPrompt: true,
	}
}

// BenchmarkRender20Turns renders the 20-turn chat with the Go engine, and beside it (same
// run, same machine) with @huggingface/jinja in Node.js and with Python's jinja2 where
// they are installed. Compare the cpu-ns/render column (CPU time per render; ns/render is
// wall time, which other jobs on a shared machine inflate): for the external engines both
// come from their own loop, without process start.
func BenchmarkRender20Turns(b *testing.B) {
	chat := benchChat()
	b.Run("model=chatml/engine=go", func(b *testing.B) {
		tp := mustNew(b, Config{Source: benchChatML})
		benchGo(b, tp, chat.goContext(Specials{}))
	})
	dir := needOracle(b)
	models := loadOracleModels(b)
	js, err := filepath.Abs(filepath.Join("testdata", "hfjinja.cjs"))
	if err != nil {
		b.Fatal(err)
	}
	py, pyErr := exec.LookPath("python3")
	if pyErr == nil && exec.Command(py, "-c", "import jinja2").Run() != nil {
		pyErr = fmt.Errorf("python3 has no jinja2")
	}
	for _, m := range models {
		b.Run("model="+m.name+"/engine=go", func(b *testing.B) {
			benchGo(b, m.tmpl, chat.goContext(m.specials))
		})
		b.Run("model="+m.name+"/engine=go-predecoded", func(b *testing.B) {
			benchGo(b, m.tmpl, predecoded(b, chat.goContext(m.specials)))
		})
		b.Run("model="+m.name+"/engine=hfjinja-js", func(b *testing.B) {
			externalBench(b, exec.Command("node", js, dir), models, m.name, chat)
		})
		b.Run("model="+m.name+"/engine=jinja2-py", func(b *testing.B) {
			if pyErr != nil {
				b.Skipf("SKIP: %v", pyErr)
			}
			externalBench(b, pythonCmd(b, py), models, m.name, chat)
		})
	}
}

// predecoded moves MessagesJSON and ToolsJSON into Extra as decoded values, so the
// render does not pay for JSON decoding (the external engines get parsed objects too).
func predecoded(b *testing.B, ctx Context) Context {
	ctx.Extra = map[string]any{}
	for name, raw := range map[string][]byte{"messages": ctx.MessagesJSON, "tools": ctx.ToolsJSON} {
		v, err := DecodeJSON(raw)
		if err != nil {
			b.Fatal(err)
		}
		ctx.Extra[name] = v
	}
	ctx.MessagesJSON, ctx.ToolsJSON = nil, nil
	return ctx
}

func benchGo(b *testing.B, tp *Template, ctx Context) {
	out, err := tp.Render(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	c0, _ := cputime.Process()
	b.ResetTimer()
	for b.Loop() {
		if _, err := tp.Render(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/render")
	c1, _ := cputime.Process() // 0 where the platform does not tell
	b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N), "cpu-ns/render")
}

// externalBench has an external engine render the chat b.N times in its own loop and
// reports its time per render.
func externalBench(b *testing.B, cmd *exec.Cmd, models []oracleModel, model string, chat oracleCase) {
	in := oracleInput(models)
	in["bench"] = map[string]any{"template": model, "case": chat, "iterations": max(b.N, 300)}
	data, err := json.Marshal(in)
	if err != nil {
		b.Fatal(err)
	}
	out, err := runBounded(cmd, data, benchTimeout)
	if err != nil {
		b.Fatalf("%s: %v: %s", cmd.Path, err, out)
	}
	var res struct {
		NsPerRender    float64 `json:"ns_per_render"`
		CPUNsPerRender float64 `json:"cpu_ns_per_render"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("%s output %q: %v", cmd.Path, out, err)
	}
	b.ReportMetric(res.NsPerRender, "ns/render")
	b.ReportMetric(res.CPUNsPerRender, "cpu-ns/render")
}
