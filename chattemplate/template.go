package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults and upper bounds of Config's fields.
const (
	DefaultMaxSteps  = 1_000_000
	MaxMaxSteps      = 100_000_000
	DefaultMaxOutput = 4 << 20
	MaxMaxOutput     = 256 << 20
	// MaxSourceBytes bounds a template's source; real chat templates are under 20 KiB.
	MaxSourceBytes = 1 << 20
	// maxTokens bounds the lexer's output (a 1 MiB source cannot need more).
	maxTokens = 1 << 20
)

// Sentinel errors; every error from New and Render is an *Error wrapping one of these (or
// none, for a runtime type error such as adding a string to a number).
var (
	// ErrSyntax: the template does not parse.
	ErrSyntax = errors.New("template syntax error")
	// ErrLimit: MaxSteps, MaxOutput, or a fixed nesting bound was exceeded.
	ErrLimit = errors.New("template limit exceeded")
	// ErrRaised: the template called raise_exception (its message is Error.Msg).
	ErrRaised = errors.New("template raised an exception")
)

// Error is a template error with the 1-based line of the template it concerns.
type Error struct {
	Line int
	Msg  string
	Err  error // ErrSyntax, ErrLimit, ErrRaised, or nil
}

func (e *Error) Error() string {
	switch {
	case errors.Is(e.Err, ErrRaised):
		return fmt.Sprintf("chattemplate: line %d: raise_exception: %s", e.Line, e.Msg)
	case errors.Is(e.Err, ErrSyntax):
		return fmt.Sprintf("chattemplate: line %d: syntax error: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("chattemplate: line %d: %s", e.Line, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Config configures New. Zero values mean the documented defaults.
type Config struct {
	// Source is the Jinja template text (tokenizer_config.json's chat_template). At most
	// MaxSourceBytes.
	Source string
	// MaxSteps bounds the work of one Render: every statement, loop iteration, call and
	// filter application costs one step. Default DefaultMaxSteps, at most MaxMaxSteps.
	// A 20-turn chat with the Qwen3 template takes about 800 steps.
	MaxSteps int
	// MaxOutput bounds the rendered text in bytes, and every string or list a template
	// builds on the way. Default DefaultMaxOutput, at most MaxMaxOutput.
	MaxOutput int
}

func (c Config) validate() (Config, error) {
	switch {
	case len(c.Source) > MaxSourceBytes:
		return c, fmt.Errorf("chattemplate: Source is %d bytes, more than %d", len(c.Source), MaxSourceBytes)
	case c.MaxSteps < 0 || c.MaxSteps > MaxMaxSteps:
		return c, fmt.Errorf("chattemplate: MaxSteps %d out of range [0, %d]", c.MaxSteps, MaxMaxSteps)
	case c.MaxOutput < 0 || c.MaxOutput > MaxMaxOutput:
		return c, fmt.Errorf("chattemplate: MaxOutput %d out of range [0, %d]", c.MaxOutput, MaxMaxOutput)
	case !utf8Valid(c.Source):
		return c, errors.New("chattemplate: Source is not valid UTF-8")
	}
	if c.MaxSteps == 0 {
		c.MaxSteps = DefaultMaxSteps
	}
	if c.MaxOutput == 0 {
		c.MaxOutput = DefaultMaxOutput
	}
	return c, nil
}

// Template is a parsed chat template. It is immutable: Render may be called from many
// goroutines at once.
type Template struct {
	cfg  Config
	body []node
}

// New parses cfg.Source.
func New(cfg Config) (*Template, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	toks, err := tokenize(cfg.Source, maxTokens)
	if err != nil {
		return nil, err
	}
	body, err := parse(toks)
	if err != nil {
		return nil, err
	}
	return &Template{cfg: cfg, body: body}, nil
}

// Context is what vLLM passes to a chat template (vllm/entrypoints/chat_utils.py's
// apply_hf_chat_template, through transformers' apply_chat_template):
//
//	messages, add_generation_prompt, tools (None when absent), documents (None),
//	bos_token and eos_token (when the tokenizer has them), then chat_template_kwargs
//	such as enable_thinking (Extra), which override the rest.
//
// Go maps have no key order; their keys are visited (and printed by tojson) sorted. Pass
// *Dict values, or the request's JSON in MessagesJSON / ToolsJSON, where the order of
// keys reaches the output (Qwen3 prints each tool with tojson).
type Context struct {
	Messages            []map[string]any
	AddGenerationPrompt bool
	Tools               []map[string]any
	BOSToken, EOSToken  string // "" leaves the variable undefined
	Extra               map[string]any
	// MessagesJSON and ToolsJSON, when set, replace Messages and Tools: JSON arrays decoded
	// with DecodeJSON, so objects keep their key order.
	MessagesJSON, ToolsJSON []byte
	// Now is the time strftime_now formats; zero means time.Now().
	Now time.Time

	// Set by FromRequest: the normalized messages and tools, in place of the fields above.
	fromRequest bool
	messages    []any
	tools       any
}

// Render applies the template to ctx.
func (t *Template) Render(ctx Context) (string, error) {
	return t.render(ctx, renderOpts{})
}

func (t *Template) render(ctx Context, opts renderOpts) (string, error) {
	vars, err := ctx.vars()
	if err != nil {
		return "", err
	}
	ev := &evaluator{maxSteps: t.cfg.MaxSteps, work: meter{max: min(t.cfg.MaxSteps, math.MaxInt/workPerStep) * workPerStep}, maxOutput: t.cfg.MaxOutput, now: time.Now, opts: opts}
	if !ctx.Now.IsZero() {
		now := ctx.Now
		ev.now = func() time.Time { return now }
	}
	ev.root = &scope{vars: vars}
	ev.out.Grow(outputGuess(vars, t.cfg.MaxOutput))
	// The template's own top-level sets live one scope below the context, as in Jinja.
	if _, err := ev.exec(t.body, &scope{parent: ev.root}); err != nil {
		return "", err
	}
	return ev.out.String(), nil
}

// outputGuess sizes the output buffer: the messages' text plus room for the markup.
func outputGuess(vars map[string]any, limit int) int {
	n := 1024
	msgs, _ := vars["messages"].([]any)
	for _, m := range msgs {
		if d, ok := m.(*Dict); ok {
			if c, ok := d.Get("content"); ok && isString(c) {
				n += len(c.(string)) + 64
			}
		}
	}
	return min(n, limit)
}

// vars builds the template's global variables.
func (c *Context) vars() (map[string]any, error) {
	vars := make(map[string]any, 8+len(c.Extra))
	if err := c.listVars(vars); err != nil {
		return nil, err
	}
	vars["documents"] = nil
	vars["add_generation_prompt"] = c.AddGenerationPrompt
	if c.BOSToken != "" {
		vars["bos_token"] = c.BOSToken
	}
	if c.EOSToken != "" {
		vars["eos_token"] = c.EOSToken
	}
	for k, v := range c.Extra {
		cv, err := fromGo(v, 0)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: Extra[%q]: %w", k, err)
		}
		vars[k] = cv
	}
	return vars, nil
}

// listVars sets messages (never None) and tools (None when absent).
func (c *Context) listVars(vars map[string]any) error {
	if c.fromRequest {
		vars["messages"], vars["tools"] = c.messages, c.tools
		return nil
	}
	msgs, err := listVar("Messages", c.Messages, c.MessagesJSON)
	if err != nil {
		return err
	}
	if msgs == nil {
		msgs = []any{}
	}
	vars["messages"] = msgs
	tools, err := listVar("Tools", c.Tools, c.ToolsJSON)
	vars["tools"] = tools
	return err
}

// listVar converts Messages or Tools; nil stays nil (None).
func listVar(field string, list []map[string]any, raw []byte) (any, error) {
	if raw != nil {
		v, err := DecodeJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: %sJSON: %w", field, err)
		}
		if _, ok := v.([]any); !ok && v != nil {
			return nil, fmt.Errorf("chattemplate: %sJSON is not a JSON array", field)
		}
		return v, nil
	}
	if list == nil {
		return nil, nil
	}
	out := make([]any, len(list))
	for i, m := range list {
		v, err := fromGo(m, 0)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: %s[%d]: %w", field, i, err)
		}
		out[i] = v
	}
	return out, nil
}
