package chattemplate_test

import (
	"fmt"

	"github.com/kvindex/kvindex/chattemplate"
)

// A ChatML template rendered with vLLM's context: the prompt a router must tokenize to
// find the blocks an engine cached for this chat.
func ExampleTemplate_Render() {
	tmpl, err := chattemplate.New(chattemplate.Config{Source: `
{%- for m in messages %}
    {{- '<|im_start|>' + m.role + '\n' + m.content | trim + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}`})
	if err != nil {
		panic(err)
	}
	prompt, err := tmpl.Render(chattemplate.Context{
		Messages: []map[string]any{
			{"role": "system", "content": "You are terse."},
			{"role": "user", "content": "  Capital of France?  "},
		},
		AddGenerationPrompt: true,
		Extra:               map[string]any{"enable_thinking": false},
	})
	if err != nil {
		panic(err)
	}
	fmt.Print(prompt)
	// Output:
	// <|im_start|>system
	// You are terse.<|im_end|>
	// <|im_start|>user
	// Capital of France?<|im_end|>
	// <|im_start|>assistant
	// <think>
	//
	// </think>
}

// Errors name the template line; raise_exception's message comes through.
func ExampleError() {
	tmpl, _ := chattemplate.New(chattemplate.Config{Source: "{% if messages[0].role != 'user' %}\n{{ raise_exception('Conversation must start with a user message') }}\n{% endif %}"})
	_, err := tmpl.Render(chattemplate.Context{Messages: []map[string]any{{"role": "assistant", "content": "hi"}}})
	fmt.Println(err)
	// Output: chattemplate: line 2: raise_exception: Conversation must start with a user message
}

// A request body's JSON keeps its key order through tojson.
func ExampleDecodeJSON() {
	tools, _ := chattemplate.DecodeJSON([]byte(`[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]`))
	tmpl, _ := chattemplate.New(chattemplate.Config{Source: "{% for t in tools %}{{ t | tojson }}{% endfor %}"})
	out, _ := tmpl.Render(chattemplate.Context{Extra: map[string]any{"tools": tools}})
	fmt.Println(out)
	// Output: {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
}
