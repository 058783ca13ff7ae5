package tokenize_test

import (
	"context"
	"fmt"

	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/hash"
	"github.com/kvindex/kvindex/tokenize"
)

// A router that receives text: the prompt becomes the token ids the inference engine
// computes (here with a toy tokenizer.json; in a deployment tokenize.LoadModel reads
// the model's folder, and EncodeChat renders a chat with its template first), then
// per-block content hashes, then the index's question. The answer is the one the same
// token ids get.
func Example() {
	tok, err := tokenize.New(tokenize.Config{TokenizerJSON: []byte(`{
	  "added_tokens": [{"id": 12, "content": "<s>", "special": true}],
	  "post_processor": {"type": "TemplateProcessing",
	    "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
	    "special_tokens": {"<s>": {"ids": [12]}}},
	  "model": {"type": "BPE",
	    "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, " ": 4, "w": 5, "r": 6, "d": 7, "he": 8, "ll": 9, "hell": 10, "hello": 11},
	    "merges": ["h e", "l l", "he ll", "hell o"]}}`)})
	if err != nil {
		panic(err)
	}
	ids, err := tok.Encode(nil, "hello world", true) // a completions prompt: BOS added
	if err != nil {
		panic(err)
	}
	const blockSize = 4
	content, err := hash.Blocks(nil, ids, blockSize)
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	e, err := engine.New(engine.Config{})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	// pod-a cached both blocks of this prompt (its events say so; written out here).
	if err := e.Store("pod-a", []engine.Block{{Content: content[0], Seq: 1}, {Content: content[1], Seq: 2}}); err != nil {
		panic(err)
	}
	if err := e.Barrier(ctx); err != nil {
		panic(err)
	}
	matches, err := e.FindMatches(ctx, content, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("ids:", ids)
	for _, m := range matches {
		fmt.Printf("%s holds the first %d of %d blocks\n", m.Worker, m.Score, len(content))
	}
	// Output:
	// ids: [12 11 4 5 3 6 2 7]
	// pod-a holds the first 2 of 2 blocks
}
