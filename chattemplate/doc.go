// Package chattemplate renders Hugging Face chat templates (Jinja) exactly as vLLM does:
// a pure-Go Jinja engine restricted to what chat templates use, run with the context
// vLLM passes (messages, add_generation_prompt, tools, bos_token, eos_token and
// chat_template_kwargs such as enable_thinking).
//
// It owns the template language only; package tokenize turns the rendered text into
// token ids. Anyone may call it: New parses once, and a *Template renders on any number of
// goroutines (each Render has its own evaluator; no goroutines are started).
//
// The semantics are Python's jinja2 as transformers configures it
// (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, plus
// tojson, raise_exception and strftime_now), because that is what vLLM runs.
package chattemplate
