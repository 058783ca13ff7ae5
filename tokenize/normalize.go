package tokenize

import (
	"strings"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// normOp is one step of a normalizer: a Unicode normal form (Qwen's NFC), or a Prepend or a literal Replace
// (SentencePiece-style models write spaces as ▁ this way).
type normOp struct {
	kind     int
	form     norm.Form
	from, to string
}

const (
	normForm = 1 + iota
	normPrepend
	normReplace
)

// normalize applies ops to s, writing each changed step to the one of sc's two buffers
// that the input does not live in; the result aliases them
// (or s when nothing changed) and is valid until the next call.
func normalize(ops []normOp, s string, sc *scratch) string {
	next := 0 // the buffer s does not alias
	for _, op := range ops {
		buf := sc.norm[next][:0]
		switch op.kind {
		case normForm:
			n := op.form.QuickSpanString(s)
			if n == len(s) {
				continue
			}
			// norm.Iter, kept in the scratch, normalizes without allocating (the
			// form's own AppendString and IsNormalString allocate).
			buf = append(buf, s[:n]...)
			sc.iter.InitString(op.form, s[n:])
			for !sc.iter.Done() {
				buf = append(buf, sc.iter.Next()...)
			}
		case normPrepend:
			if s == "" {
				continue
			}
			buf = append(append(buf, op.to...), s...)
		case normReplace:
			if !strings.Contains(s, op.from) {
				continue
			}
			buf = appendReplace(buf, s, op.from, op.to)
		}
		sc.norm[next] = buf
		s = bytesString(buf)
		next ^= 1
	}
	return s
}

func appendReplace(dst []byte, s, from, to string) []byte {
	for {
		i := strings.Index(s, from)
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(append(dst, s[:i]...), to...)
		s = s[i+len(from):]
	}
}

// bytesString views b as a string without copying; b must not change while it is used.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
