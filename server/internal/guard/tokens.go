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

// ReadTokens reads a token file: one token a line, blank lines and lines starting with
// '#' ignored, at most MaxTokens tokens of MinTokenBytes to MaxTokenBytes each. A file
// that other users may read is refused (ErrTokenFileMode).
func ReadTokens(path string) (*Tokens, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("%s: mode %v: %w", path, fi.Mode().Perm(), ErrTokenFileMode)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	toks := &Tokens{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), MaxTokenBytes+2)
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		switch {
		case len(t) < MinTokenBytes || len(t) > MaxTokenBytes:
			return nil, fmt.Errorf("%s: a token of %d bytes (want %d to %d)", path, len(t), MinTokenBytes, MaxTokenBytes)
		case len(toks.digests) == MaxTokens:
			return nil, fmt.Errorf("%s: more than %d tokens", path, MaxTokens)
		}
		toks.digests = append(toks.digests, sha256.Sum256([]byte(t)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(toks.digests) == 0 {
		return nil, fmt.Errorf("%s: no token", path)
	}
	return toks, nil
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
