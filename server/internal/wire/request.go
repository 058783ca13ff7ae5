package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/kvindex/kvindex/engine"
)

// A hand-written reader for the body of POST /v1/match. encoding/json scans a body twice
// and decodes a 6,400-element token array element by element through reflection: on the
// benchmark machine that was about 0.2 ms for a 400-hash query and 1.1 ms for a
// 6,400-token one, most of the request's cost. The body is one object with five string
// fields and two integer arrays, so one pass reads it; the strict rules stay (unknown
// fields, wrong types and trailing data are errors).

// Request is a decoded match (or routed) request.
type Request struct {
	Model, Namespace, LoraName, CacheSalt, Policy string

	Tokens               []uint32
	Hashes               []uint64
	HasTokens, HasHashes bool
	// ExtraKeys is the raw JSON of extra_keys (extrakeys.go), nil when absent.
	ExtraKeys []byte
	// Record (match only) asks to record the pick as a prediction.
	Record bool
	// Weights (match only) are tier_weights when HasWeights: NWeights numbers, the
	// first engine.NumTiers of them kept; the pipeline checks the count and the range
	// (match.go), as it does a gRPC request's.
	Weights    [engine.NumTiers]float64
	NWeights   int
	HasWeights bool
	// Worker and TTLms (routed only): the worker a request was sent to and the
	// prediction's lifetime in milliseconds (0: the server's default; the pipeline
	// checks its bound).
	Worker string
	TTLms  uint64
	// Pick (match only) counts the pick as routed; RequestID names the request for
	// its finished report (match and routed); Load (match only) is the raw JSON of the
	// caller's per-worker load, nil when absent (pick.go reads both).
	Pick      bool
	RequestID string
	Load      []byte
	// TopK (match only) bounds the matches answered (0: Config.MaxMatches); the
	// pipeline checks it against MaxMaxMatches.
	TopK uint64
	// Text (match only) is the request's text instead of its tokens (text.go).
	Text Text
}

// ErrSyntax is the error of a body that is not JSON at all.
var ErrSyntax = errors.New("invalid JSON")

// Kind is a request kind Decode reads; each allows its own fields.
type Kind int

// The request kinds: POST /v1/match (and /v1/route's match half) and POST /v1/routed.
const (
	KindMatch Kind = iota
	KindRouted
)

// requestFields are the fields of each kind, each with its bit in the duplicate check.
var requestFields = [2]map[string]uint32{
	KindMatch: {"model": 1, "namespace": 2, "lora_name": 4, "cache_salt": 8, "policy": 16,
		"tokens": 32, "content_hashes": 64, "extra_keys": 128, "record": 256, "tier_weights": 512,
		"pick": 1024, "request_id": 2048, "load": 4096, "top_k": 8192,
		"prompt": 1 << 14, "messages": 1 << 15, "tools": 1 << 16, "add_generation_prompt": 1 << 17, "chat_template_kwargs": 1 << 18},
	KindRouted: {"model": 1, "namespace": 2, "lora_name": 4, "cache_salt": 8, "worker": 16,
		"tokens": 32, "content_hashes": 64, "extra_keys": 128, "ttl_ms": 256, "request_id": 512},
}

// DecodeMatch reads a match request from b into *rp, reusing its slices' memory.
func DecodeMatch(b []byte, rp *Request) error { return Decode(b, rp, KindMatch) }

// Decode reads a request of the given kind from b into *rp, reusing its slices'
// memory. A field outside the kind's set, or given twice, is an error.
func Decode(b []byte, rp *Request, kind Kind) (err error) {
	*rp = Request{Tokens: rp.Tokens[:0], Hashes: rp.Hashes[:0]}
	r := rp
	var seen uint32
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return fmt.Errorf("%w: want an object", ErrSyntax)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i = skipSpace(b, i+1)
		if i != len(b) {
			return errors.New("trailing data after the JSON object")
		}
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return fmt.Errorf("%w at offset %d: want a field name", ErrSyntax, i)
		}
		end, err := scanString(b, i)
		if err != nil {
			return err
		}
		key, err := stringValue(b[i:end])
		if err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return fmt.Errorf("%w at offset %d: want ':'", ErrSyntax, i)
		}
		i = skipSpace(b, i+1)
		bit, ok := requestFields[kind][key]
		if !ok {
			return fmt.Errorf("json: unknown field %q", key)
		}
		if seen&bit != 0 {
			return fmt.Errorf("json: duplicated field %q", key) // not "last wins"
		}
		seen |= bit
		var str *string
		switch key {
		case "worker":
			str = &r.Worker
		case "prompt", "messages", "tools", "add_generation_prompt", "chat_template_kwargs":
			if i, err = decodeTextField(key, b, i, &r.Text); err != nil {
				return err
			}
		case "record", "pick":
			v := false
			switch {
			case hasPrefix(b[i:], "true"):
				v, i = true, i+4
			case hasPrefix(b[i:], "false"):
				i += 5
			case hasPrefix(b[i:], "null"):
				i += 4
			default:
				return fmt.Errorf("%s: want true or false", key)
			}
			if key == "record" {
				r.Record = v
			} else {
				r.Pick = v
			}
		case "request_id":
			str = &r.RequestID
		case "load":
			end, err := scanValue(b, i)
			if err != nil {
				return fmt.Errorf("load: %w", err)
			}
			raw := b[i:end]
			if !bytes.Equal(raw, []byte("null")) && (len(raw) == 0 || raw[0] != '{') {
				return errors.New("load: want null or an object")
			}
			r.Load, i = raw, end
		case "tier_weights":
			r.HasWeights, r.NWeights, i, err = parseWeightList(b, i, &r.Weights)
			if err != nil {
				return fmt.Errorf("tier_weights: %w", err)
			}
		case "top_k", "ttl_ms":
			var v uint64
			if v, i, err = nullableUint(b, i); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if key == "top_k" {
				r.TopK = v
			} else {
				r.TTLms = v
			}
		case "model":
			str = &r.Model
		case "namespace":
			str = &r.Namespace
		case "lora_name":
			str = &r.LoraName
		case "cache_salt":
			str = &r.CacheSalt
		case "policy":
			str = &r.Policy
		case "tokens":
			r.Tokens, r.HasTokens, i, err = parseNumbers(b, i, 1<<32-1, false, r.Tokens[:0])
			if err != nil {
				return fmt.Errorf("tokens: %w", err)
			}
		case "content_hashes":
			r.Hashes, r.HasHashes, i, err = parseNumbers(b, i, 1<<64-1, true, r.Hashes[:0])
			if err != nil {
				return fmt.Errorf("content_hashes: %w", err)
			}
		case "extra_keys":
			end, err := scanValue(b, i)
			if err != nil {
				return fmt.Errorf("extra_keys: %w", err)
			}
			raw := b[i:end]
			if !bytes.Equal(raw, []byte("null")) && (len(raw) == 0 || raw[0] != '[' || !json.Valid(raw)) {
				return errors.New("extra_keys: want null or an array")
			}
			r.ExtraKeys, i = raw, end
		default:
			return fmt.Errorf("json: unknown field %q", key)
		}
		if str != nil {
			switch {
			case hasPrefix(b[i:], "null"):
				*str, i = "", i+4
			case i < len(b) && b[i] == '"':
				end, err := scanString(b, i)
				if err != nil {
					return err
				}
				if *str, err = stringValue(b[i:end]); err != nil {
					return err
				}
				i = end
			default:
				return fmt.Errorf("%s: want a string", key)
			}
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return fmt.Errorf("%w: unexpected end", ErrSyntax)
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if skipSpace(b, i+1) != len(b) {
				return errors.New("trailing data after the JSON object")
			}
			return nil
		default:
			return fmt.Errorf("%w at offset %d: want ',' or '}'", ErrSyntax, i)
		}
	}
}

// nullableUint reads the unsigned integer or null (0) at b[i] and returns the offset
// after it.
func nullableUint(b []byte, i int) (uint64, int, error) {
	if hasPrefix(b[i:], "null") {
		return 0, i + 4, nil
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && !isSpace(b[j]) {
		j++
	}
	v, err := parseUint(b[i:j], false)
	return v, j, err
}

func hasPrefix(b []byte, s string) bool { return len(b) >= len(s) && string(b[:len(s)]) == s }

// scanString returns the offset just past the JSON string starting at b[i] == '"'.
func scanString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '\\':
			j++
		case c == '"':
			return j + 1, nil
		case c < 0x20:
			return 0, fmt.Errorf("%w: control character in a string", ErrSyntax)
		}
	}
	return 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
}

// stringValue decodes a JSON string literal (quotes included): directly when it holds
// no escapes, else through encoding/json.
func stringValue(lit []byte) (string, error) {
	inner := lit[1 : len(lit)-1]
	plain := utf8.Valid(inner)
	for _, c := range inner {
		if c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		return string(inner), nil
	}
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return "", err
	}
	return s, nil
}

// parseNumbers reads the JSON array at b[i], appending its elements to dst, and returns
// the offset past it. Elements are non-negative integers no larger than max (which T
// holds); with allowStrings, also strings holding a decimal or 0x-prefixed hexadecimal
// integer. null is an absent list (has false).
func parseNumbers[T uint32 | uint64](b []byte, i int, max uint64, allowStrings bool, dst []T) (vals []T, has bool, end int, err error) {
	if hasPrefix(b[i:], "null") {
		return dst, false, i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return dst, false, i, errors.New("want an array")
	}
	if dst == nil {
		dst = []T{}
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, true, i + 1, nil
	}
	for n := 0; ; n++ {
		if i >= len(b) {
			return dst, false, i, fmt.Errorf("%w: unterminated array", ErrSyntax)
		}
		var v uint64
		if b[i] == '"' {
			if !allowStrings {
				return dst, false, i, fmt.Errorf("element %d: a string, want a number", n)
			}
			j := i + 1
			for j < len(b) && b[j] != '"' {
				j++
			}
			if j >= len(b) {
				return dst, false, i, fmt.Errorf("%w: unterminated string", ErrSyntax)
			}
			v, err = parseUint(b[i+1:j], true)
			i = j + 1
		} else {
			j := i
			for j < len(b) && b[j] != ',' && b[j] != ']' && !isSpace(b[j]) {
				j++
			}
			v, err = parseUint(b[i:j], false)
			i = j
		}
		if err == nil && v > max {
			err = fmt.Errorf("%d exceeds %d", v, max)
		}
		if err != nil {
			return dst, false, i, fmt.Errorf("element %d: %v", n, err)
		}
		dst = append(dst, T(v))
		i = skipSpace(b, i)
		if i >= len(b) {
			return dst, false, i, fmt.Errorf("%w: unterminated array", ErrSyntax)
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return dst, true, i + 1, nil
		default:
			return dst, false, i, fmt.Errorf("%w in array at offset %d", ErrSyntax, i)
		}
	}
}

// parseWeightList reads the JSON array of numbers at b[i], keeping the first len(*w) of
// them in *w, and returns how many it holds and the offset past it; null is an absent
// list (has false). The numbers are JSON numbers (no strings, no NaN or Infinity);
// their count and range are the pipeline's to check (match.go).
func parseWeightList(b []byte, i int, w *[engine.NumTiers]float64) (has bool, n, end int, err error) {
	if hasPrefix(b[i:], "null") {
		return false, 0, i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return false, 0, i, errors.New("want an array of numbers")
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return true, 0, i + 1, nil
	}
	for ; ; n++ {
		j := i
		for j < len(b) && b[j] != ',' && b[j] != ']' && !isSpace(b[j]) {
			j++
		}
		num := b[i:j]
		if !jsonNumber(num) {
			return false, 0, i, fmt.Errorf("element %d: %q is not a number", n, num)
		}
		v, perr := strconv.ParseFloat(string(num), 64)
		if perr != nil {
			return false, 0, i, fmt.Errorf("element %d: %q is out of range", n, num)
		}
		if n < len(w) {
			w[n] = v
		}
		i = skipSpace(b, j)
		if i >= len(b) {
			return false, 0, i, fmt.Errorf("%w: unterminated array", ErrSyntax)
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return true, n + 1, i + 1, nil
		default:
			return false, 0, i, fmt.Errorf("%w in array at offset %d", ErrSyntax, i)
		}
	}
}

// jsonNumber reports whether b is a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(b []byte) bool {
	i := 0
	digits := func() int {
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0, n > 1 && b[i-n] == '0':
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// parseUint reads a decimal integer (JSON style: no sign, fraction, exponent or leading
// zeros) or, with hex, also a 0x-prefixed hexadecimal one.
func parseUint(b []byte, hex bool) (uint64, error) {
	if len(b) == 0 {
		return 0, errors.New("empty number")
	}
	if hex && len(b) > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X') {
		if len(b) > 18 {
			return 0, fmt.Errorf("%q overflows 64 bits", b)
		}
		var v uint64
		for _, c := range b[2:] {
			var d byte
			switch {
			case c >= '0' && c <= '9':
				d = c - '0'
			case c >= 'a' && c <= 'f':
				d = c - 'a' + 10
			case c >= 'A' && c <= 'F':
				d = c - 'A' + 10
			default:
				return 0, fmt.Errorf("%q is not an unsigned integer", b)
			}
			v = v<<4 | uint64(d)
		}
		return v, nil
	}
	if len(b) > 1 && b[0] == '0' {
		return 0, fmt.Errorf("%q: leading zero", b)
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not an unsigned integer", b)
		}
		d := uint64(c - '0')
		if v > (^uint64(0)-d)/10 {
			return 0, fmt.Errorf("%q overflows 64 bits", b)
		}
		v = v*10 + d
	}
	return v, nil
}
