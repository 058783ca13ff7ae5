package tokenize

// addedTrie finds added tokens (special or not) in raw text before anything else runs:
// at each position the longest token that starts there, scanning left to right (the
// leftmost-longest match of Hugging Face's tokenizers and transformers.js). Tokens are
// valid UTF-8, so a match always starts on a character boundary.
type addedTrie struct {
	root  [256]int32 // first byte -> node, 0 none
	nodes []trieNode // nodes[0] unused
}

type trieNode struct {
	edges []trieEdge
	token int32 // index into Tokenizer.added, -1 none
}

type trieEdge struct {
	b     byte
	child int32
}

func (t *addedTrie) insert(s string, token int32) {
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, trieNode{token: -1})
	}
	n := t.root[s[0]]
	if n == 0 {
		n = t.newNode()
		t.root[s[0]] = n
	}
	for i := 1; i < len(s); i++ {
		child := int32(0)
		for _, e := range t.nodes[n].edges {
			if e.b == s[i] {
				child = e.child
				break
			}
		}
		if child == 0 {
			child = t.newNode()
			t.nodes[n].edges = append(t.nodes[n].edges, trieEdge{b: s[i], child: child})
		}
		n = child
	}
	t.nodes[n].token = token
}

func (t *addedTrie) newNode() int32 {
	t.nodes = append(t.nodes, trieNode{token: -1})
	return int32(len(t.nodes) - 1)
}

// match returns the longest added token starting at s[i] and its length, or -1.
func (t *addedTrie) match(s string, i int) (int32, int) {
	n := t.root[s[i]]
	best, bestLen := int32(-1), 0
	for j := i + 1; n != 0; j++ {
		if tok := t.nodes[n].token; tok >= 0 {
			best, bestLen = tok, j-i
		}
		if j >= len(s) {
			break
		}
		next := int32(0)
		for _, e := range t.nodes[n].edges {
			if e.b == s[j] {
				next = e.child
				break
			}
		}
		n = next
	}
	return best, bestLen
}
