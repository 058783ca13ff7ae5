// Package refmodel is the reference model of the kvindex contract: slow, obvious and
// exact. It exists so that tests, fuzzers and the gen-ops command can ask "what must the
// answer be?" for any event history.
//
// It represents a prefix exactly, not by a hash: every distinct sequence of content
// values is interned as a node of a trie, (parent node, content) -> node, so two blocks
// have the same prefix exactly when they name the same node. A worker holds a map from
// engine hash to node; a query walks the trie and, for each worker, counts how long every
// step is held. No position arithmetic, no jump search, nothing clever.
//
// A Model is not safe for concurrent use.
package refmodel
