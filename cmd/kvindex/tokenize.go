package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvindex/kvindex/tokenize"
)

func init() {
	register("tokenize", command{
		summary:  "turn prompts and chats (JSON lines on stdin) into the token ids vLLM computes for them",
		synopsis: "--tokenizer DIR [flags]",
		about: "Loads a model folder (tokenizer.json, tokenizer_config.json, optional\n" +
			"chat_template.jinja) and reads JSON lines from stdin, each {\"prompt\": \"...\"} or\n" +
			"{\"messages\": [...], \"add_generation_prompt\": true, \"tools\": [...],\n" +
			"\"chat_template_kwargs\": {...}}; prints one JSON line per input: {\"ids\": [...]}\n" +
			"(with \"text\", the rendered chat, for messages) or {\"error\": \"...\"}. As vLLM: a prompt\n" +
			"is encoded with the tokenizer's special tokens (Llama's BOS), a chat is rendered by\n" +
			"the model's template (add_generation_prompt defaults to true) and encoded without.\n" +
			"Exits 1 when the folder does not load or stdin cannot be read.",
		run: runTokenize,
	})
}

// tokenizerHelp is --tokenizer's help, in tokenize and doctor --tokenize.
const tokenizerHelp = "model folder: tokenizer.json, tokenizer_config.json, optional chat_template.jinja (required)"

// tokenizeStdin is the command's input (tests replace it).
var tokenizeStdin io.Reader = os.Stdin

// tokenizeLine is one input line.
type tokenizeLine struct {
	Prompt              *string         `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	Kwargs              map[string]any  `json:"chat_template_kwargs"`
}

// tokenizeResult and tokenizeError are the two kinds of output line.
type tokenizeResult struct {
	IDs  []uint32 `json:"ids"`
	Text *string  `json:"text,omitempty"`
}

type tokenizeError struct {
	Error string `json:"error"`
}

func runTokenize(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tokenize", stderr)
	dir := fs.String("tokenizer", "", tokenizerHelp)
	maxLine := fs.Int("max-line-bytes", 16<<20, "longest input line accepted, in bytes (a longer one is an error line)")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	switch {
	case *dir == "":
		return exitCode(stderr, "tokenize", usageErr("--tokenizer is required"))
	case *maxLine < 1 || *maxLine > tokenize.MaxMaxInputBytes:
		return exitCode(stderr, "tokenize", usageErr("--max-line-bytes %d out of range [1, %d]", *maxLine, tokenize.MaxMaxInputBytes))
	}
	m, err := tokenize.LoadModel(tokenize.ModelConfig{Dir: *dir, Tokenizer: tokenize.Config{MaxInputBytes: *maxLine}})
	if err != nil {
		return exitCode(stderr, "tokenize", err)
	}
	return exitCode(stderr, "tokenize", tokenizeLines(m, tokenizeStdin, stdout, *maxLine))
}

// tokenizeLines answers each line of in on out. A line that is too long or does not
// parse gets an error line; reading or writing failures end the command.
func tokenizeLines(m *tokenize.Model, in io.Reader, out io.Writer, maxLine int) error {
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	var ids []uint32
	for {
		line, tooLong, err := readLine(r, maxLine)
		if errors.Is(err, io.EOF) && len(line) == 0 && !tooLong {
			return w.Flush()
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading stdin: %w", err)
		}
		var res any
		switch {
		case tooLong:
			res = tokenizeError{fmt.Sprintf("line longer than %d bytes (--max-line-bytes)", maxLine)}
		case len(trimSpace(line)) == 0:
			continue
		default:
			ids, res = tokenizeOne(m, line, ids[:0])
		}
		if err := enc.Encode(res); err != nil {
			return err
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil { // answer interactive use line by line
				return err
			}
		}
	}
}

// readLine returns the next line without its newline, reading at most max bytes of it
// (the rest is discarded and tooLong set).
func readLine(r *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			tooLong = true
		} else {
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		if tooLong {
			line = nil
		}
		return line, tooLong, err
	}
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// tokenizeOne answers one line.
func tokenizeOne(m *tokenize.Model, line []byte, ids []uint32) ([]uint32, any) {
	var in tokenizeLine
	if err := json.Unmarshal(line, &in); err != nil {
		return ids, tokenizeError{"not a JSON object: " + err.Error()}
	}
	hasMsgs := !isJSONNull(in.Messages)
	switch {
	case in.Prompt != nil && hasMsgs:
		return ids, tokenizeError{"give prompt or messages, not both"}
	case in.Prompt != nil:
		ids, err := m.EncodePrompt(ids, *in.Prompt)
		if err != nil {
			return ids, tokenizeError{err.Error()}
		}
		return ids, tokenizeResult{IDs: nonNil(ids)}
	case hasMsgs:
		gen := in.AddGenerationPrompt == nil || *in.AddGenerationPrompt
		tools := in.Tools
		if isJSONNull(tools) {
			tools = nil
		}
		ids, text, err := m.EncodeChat(ids, tokenize.Chat{MessagesJSON: in.Messages, ToolsJSON: tools, AddGenerationPrompt: gen, Kwargs: in.Kwargs})
		if err != nil {
			return ids, tokenizeError{err.Error()}
		}
		return ids, tokenizeResult{IDs: nonNil(ids), Text: &text}
	}
	return ids, tokenizeError{"prompt or messages is required"}
}

func isJSONNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// nonNil makes an empty encoding print as [], not null.
func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}
