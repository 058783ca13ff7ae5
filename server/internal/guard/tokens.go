package guard

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Bounds of a token file.
const (
	MaxTokens     = 1024
	MinTokenBytes = 16
	MaxTokenBytes = 4096
)

// ErrTokenFileMode refuses a token file that other users may read.
var ErrTokenFileMode = errors.New("readable by other users (chmod o-rwx)")

// Tokens are accepted bearer tokens, held as SHA-256 digests: compared in constant time,
// their lengths do not show either.
type Tokens struct {
	digests [][sha256.Size]byte
}

// FirstToken reads a token file (ReadTokens's format and checks) for the token a
// client sends: its first.
func FirstToken(path string) (string, error) {
	var first string
	_, err := readTokens(path, func(t string) {
		if first == "" {
			first = t
		}
	})
	return first, err
}

// ReadTokens reads a token file: one token a line, blank lines and lines starting with
// '#' ignored, at most MaxTokens tokens of MinTokenBytes to MaxTokenBytes each. A file
// that other users may read is refused (ErrTokenFileMode).
func ReadTokens(path string) (*Tokens, error) {
	toks := &Tokens{}
	if _, err := readTokens(path, func(t string) { toks.digests = append(toks.digests, sha256.Sum256([]byte(t))) }); err != nil {
		return nil, err
	}
	return toks, nil
}

// readTokens reads a token file, calling each with every token, and returns how many.
func readTokens(path string, each func(string)) (int, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return 0, fmt.Errorf("%s: mode %v: %w", path, fi.Mode().Perm(), ErrTokenFileMode)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), MaxTokenBytes+2)
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		switch {
		case len(t) < MinTokenBytes || len(t) > MaxTokenBytes:
			return 0, fmt.Errorf("%s: a token of %d bytes (want %d to %d)", path, len(t), MinTokenBytes, MaxTokenBytes)
		case n == MaxTokens:
			return 0, fmt.Errorf("%s: more than %d tokens", path, MaxTokens)
		}
		each(t)
		n++
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: no token", path)
	}
	return n, nil
}

// Len is how many tokens there are (0 for nil).
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.digests)
}

// Bearer reports whether the credential v ("Bearer TOKEN") names one of the tokens.
func (t *Tokens) Bearer(v string) bool {
	tok, ok := strings.CutPrefix(v, "Bearer ")
	if !ok || t == nil {
		return false
	}
	d := sha256.Sum256([]byte(tok))
	found := 0
	for i := range t.digests {
		found |= subtle.ConstantTimeCompare(d[:], t.digests[i][:])
	}
	return found == 1
}
