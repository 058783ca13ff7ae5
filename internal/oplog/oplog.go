package oplog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
)

// Kind is an op's type.
type Kind uint8

// The op kinds, in the spelling of the log's "op" field.
const (
	Stored Kind = iota + 1
	Removed
	Cleared
	RemoveWorker
	Query
	// Copied: the worker holds, on the op's medium (host or disk), copies of the blocks
	// it holds on another tier under the op's seqs.
	Copied
	// Groups declares a hybrid worker's KV-cache groups (SPEC, "Hybrid models").
	Groups
)

var kindNames = map[string]Kind{
	"stored": Stored, "removed": Removed, "cleared": Cleared,
	"remove_worker": RemoveWorker, "query": Query, "copied": Copied, "groups": Groups,
}

// The group kinds of a groups op, in the log's spelling.
const (
	KindFull          = "full"
	KindSlidingWindow = "sliding_window"
	KindMamba         = "mamba"
)

// GroupSpec is one KV-cache group of a groups op, as the line gives it. Whether it is
// well formed (a known kind, a block size that is a positive multiple of the unit, a
// window exactly on sliding_window groups) is the contract's to decide, not the log's:
// a log keeps the declarations the contract rejects.
type GroupSpec struct {
	Kind      string
	BlockSize int
	// Window is a sliding_window group's window in tokens; HasWindow says whether the
	// line carried one.
	Window    int
	HasWindow bool
}

func (k Kind) String() string {
	for n, v := range kindNames {
		if v == k {
			return n
		}
	}
	return "unknown"
}

// MaxLineBytes bounds one line of a log; a longer line is a malformed-line error.
const MaxLineBytes = 64 << 20

// Op is one line of a log.
type Op struct {
	Kind      Kind
	Worker    string
	Parent    uint64
	HasParent bool
	// Blocks holds (content, seq) pairs of a stored op. A block of a group that spans
	// several units has a list of contents: then Contents is not nil, Contents[i] is
	// block i's list (one value for a block written with a single content) and
	// Blocks[i][0] is its first value (0 for an empty list).
	Blocks   [][2]uint64
	Contents [][]uint64
	// Group is a stored, removed or copied op's KV-cache group (its optional "group"
	// field; 0 when absent).
	Group int
	// Unit and GroupSpecs are a groups op's unit (the index's block size in tokens) and
	// its groups, in order.
	Unit       int
	GroupSpecs []GroupSpec
	// Seqs holds the engine hashes of a removed op.
	Seqs []uint64
	// Tier is a stored or removed op's storage tier, from its optional "medium" field:
	// 0 device (the default), 1 host, 2 disk (TierNames).
	Tier uint8
	// Content holds a query's per-block content hashes.
	Content []uint64
	// Expect and Sizes are a query's exact answer; HasExpect says whether the line
	// carried one (an empty map is the answer "no worker matches").
	Expect    map[string]int
	Sizes     map[string]int
	HasExpect bool
	// Tiers, when not nil, is a query's expected per-tier lengths: for each worker of
	// Expect, the leading blocks it holds on the device, on the device or host, and on
	// any tier. Logs with media carry it; the answer's score is the last one.
	Tiers map[string][3]int
	// Line is the 1-based line number the op was read from (0 for ops built in memory).
	Line int
}

// ErrMalformed wraps every error about the content of a line.
var ErrMalformed = errors.New("oplog: malformed line")

// LineError is the error for one malformed line; it wraps ErrMalformed.
type LineError struct {
	Line   int
	Reason string
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// Unwrap makes errors.Is(err, ErrMalformed) true.
func (e *LineError) Unwrap() error { return ErrMalformed }

type wire struct {
	Op      string            `json:"op"`
	Worker  *string           `json:"worker"`
	Parent  *uint64           `json:"parent"`
	Blocks  *[]wireBlock      `json:"blocks"`
	Group   *int              `json:"group"`
	Unit    *int              `json:"unit"`
	Groups  *[]wireGroup      `json:"groups"`
	Seqs    *[]uint64         `json:"seqs"`
	Content *[]uint64         `json:"content"`
	Expect  *map[string]int   `json:"expect"`
	Sizes   *map[string]int   `json:"sizes"`
	Medium  *string           `json:"medium"`
	Tiers   *map[string][]int `json:"tiers"`
}

// wireBlock is one [content, seq] pair of a stored line, whose content is a number or,
// for a group spanning several units, a list of numbers.
type wireBlock struct {
	content []uint64
	list    bool // the content was written as a list
	seq     uint64
}

func (b *wireBlock) UnmarshalJSON(data []byte) error {
	var pair []json.RawMessage
	if err := json.Unmarshal(data, &pair); err != nil || len(pair) != 2 {
		return errors.New("not a [content, seq] pair")
	}
	if err := json.Unmarshal(pair[1], &b.seq); err != nil {
		return fmt.Errorf("seq: %w", err)
	}
	c := bytes.TrimSpace(pair[0])
	if len(c) > 0 && c[0] == '[' {
		b.list = true
		if err := json.Unmarshal(c, &b.content); err != nil {
			return fmt.Errorf("content: %w", err)
		}
		if b.content == nil {
			b.content = []uint64{}
		}
		return nil
	}
	var v uint64
	if err := json.Unmarshal(c, &v); err != nil {
		return fmt.Errorf("content: %w", err)
	}
	b.content = []uint64{v}
	return nil
}

type wireGroup struct {
	Kind      *string `json:"kind"`
	BlockSize *int    `json:"block_size"`
	Window    *int    `json:"window"`
}

// TierNames are the values of a stored or removed op's "medium", by tier.
var TierNames = [3]string{"device", "host", "disk"}

func parseTier(name string) (uint8, bool) {
	for t, n := range TierNames {
		if n == name {
			return uint8(t), true
		}
	}
	return 0, false
}

// Parse decodes one line. line is only used in error messages.
func Parse(b []byte, line int) (Op, error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return Op{}, &LineError{Line: line, Reason: err.Error()}
	}
	bad := func(format string, args ...any) (Op, error) {
		return Op{}, &LineError{Line: line, Reason: fmt.Sprintf(format, args...)}
	}
	k, ok := kindNames[w.Op]
	if !ok {
		return bad("unknown op %q", w.Op)
	}
	op := Op{Kind: k, Line: line}
	if w.Medium != nil {
		if k != Stored && k != Removed && k != Copied {
			return bad("%s takes no medium", w.Op)
		}
		t, ok := parseTier(*w.Medium)
		if !ok {
			return bad("unknown medium %q (want device, host or disk)", *w.Medium)
		}
		op.Tier = t
	}
	if w.Tiers != nil && (k != Query || w.Expect == nil || *w.Tiers == nil) {
		return bad("tiers must be an object, on a query with expect")
	}
	if k != Query {
		if w.Worker == nil || *w.Worker == "" {
			return bad("%s needs a non-empty worker", w.Op)
		}
		op.Worker = *w.Worker
	}
	if w.Group != nil {
		if k != Stored && k != Removed && k != Copied {
			return bad("%s takes no group", w.Op)
		}
		if *w.Group < 0 {
			return bad("group %d is negative", *w.Group)
		}
		op.Group = *w.Group
	}
	if (w.Unit != nil || w.Groups != nil) && k != Groups {
		return bad("%s takes no unit or groups", w.Op)
	}
	switch k {
	case Groups:
		if w.Unit == nil || w.Groups == nil {
			return bad("groups needs a unit and a list of groups")
		}
		op.Unit = *w.Unit
		op.GroupSpecs = make([]GroupSpec, len(*w.Groups))
		for i, g := range *w.Groups {
			if g.Kind == nil || g.BlockSize == nil {
				return bad("group %d needs a kind and a block_size", i)
			}
			op.GroupSpecs[i] = GroupSpec{Kind: *g.Kind, BlockSize: *g.BlockSize}
			if g.Window != nil {
				op.GroupSpecs[i].Window, op.GroupSpecs[i].HasWindow = *g.Window, true
			}
		}
	case Stored:
		if w.Blocks == nil {
			return bad("stored needs blocks")
		}
		op.Blocks = make([][2]uint64, len(*w.Blocks))
		for i, b := range *w.Blocks {
			if b.list && op.Contents == nil {
				op.Contents = make([][]uint64, len(*w.Blocks))
			}
			var first uint64
			if len(b.content) > 0 {
				first = b.content[0]
			}
			op.Blocks[i] = [2]uint64{first, b.seq}
		}
		if op.Contents != nil {
			for i, b := range *w.Blocks {
				op.Contents[i] = b.content
			}
		}
		if w.Parent != nil {
			op.Parent, op.HasParent = *w.Parent, true
		}
	case Removed, Copied:
		if w.Seqs == nil {
			return bad("%s needs seqs", w.Op)
		}
		op.Seqs = *w.Seqs
		if k == Copied && op.Tier == 0 {
			return bad("copied needs a medium other than device")
		}
	case Query:
		if w.Content == nil {
			return bad("query needs content")
		}
		op.Content = *w.Content
		if (w.Expect == nil) != (w.Sizes == nil) {
			return bad("query has expect or sizes but not both")
		}
		if w.Expect != nil {
			op.Expect, op.Sizes, op.HasExpect = *w.Expect, *w.Sizes, true
			if op.Expect == nil || op.Sizes == nil {
				return bad("expect and sizes must be objects")
			}
			// An answer lists workers scoring at least 1, each with its size (at least
			// 1: it holds the blocks it scores with), and every worker in both.
			for name, v := range op.Expect {
				size, ok := op.Sizes[name]
				switch {
				case v < 1:
					return bad("expect of %q is %d: an answer lists only workers scoring at least 1", name, v)
				case !ok:
					return bad("expect names %q, which sizes does not", name)
				case size < 1:
					return bad("size of %q is %d (want at least 1)", name, size)
				}
			}
			if len(op.Sizes) != len(op.Expect) {
				return bad("sizes names a worker that expect does not")
			}
		}
		if w.Tiers != nil {
			op.Tiers = make(map[string][3]int, len(*w.Tiers))
			for name, v := range *w.Tiers {
				if _, ok := op.Expect[name]; !ok {
					return bad("tiers names %q, which expect does not", name)
				}
				if len(v) != 3 {
					return bad("tiers of %q: %d lengths (want 3: device, host, disk)", name, len(v))
				}
				// Cumulative lengths: never negative, never shrinking, the last the score.
				if v[0] < 0 || v[0] > v[1] || v[1] > v[2] || v[2] != op.Expect[name] {
					return bad("tiers of %q: %v are not cumulative lengths ending at its score %d", name, v, op.Expect[name])
				}
				op.Tiers[name] = [3]int{v[0], v[1], v[2]}
			}
		}
	}
	return op, nil
}

// Reader reads ops line by line.
type Reader struct {
	s    *bufio.Scanner
	line int
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 1<<20), MaxLineBytes)
	return &Reader{s: s}
}

// Next returns the next op, or io.EOF after the last one. Blank lines are skipped.
func (r *Reader) Next() (Op, error) {
	for r.s.Scan() {
		r.line++
		b := bytes.TrimSpace(r.s.Bytes())
		if len(b) == 0 {
			continue
		}
		return Parse(b, r.line)
	}
	if err := r.s.Err(); err != nil {
		return Op{}, &LineError{Line: r.line + 1, Reason: err.Error()}
	}
	return Op{}, io.EOF
}

// ReadAll reads every op of r.
func ReadAll(r io.Reader) ([]Op, error) {
	rd := NewReader(r)
	var ops []Op
	for {
		op, err := rd.Next()
		if err == io.EOF {
			return ops, nil
		}
		if err != nil {
			return ops, err
		}
		ops = append(ops, op)
	}
}

// Append appends op as one JSON line (with its trailing newline) to dst. Map keys are
// written in sorted order, so equal ops give equal bytes.
func Append(dst []byte, op Op) []byte {
	dst = append(dst, `{"op":"`...)
	dst = append(dst, op.Kind.String()...)
	dst = append(dst, '"')
	if op.Kind != Query {
		dst = append(dst, `,"worker":`...)
		dst = appendString(dst, op.Worker)
	}
	switch op.Kind {
	case Stored:
		dst = appendMedium(dst, op.Tier)
		dst = appendGroup(dst, op.Group)
		if op.HasParent {
			dst = append(dst, `,"parent":`...)
			dst = strconv.AppendUint(dst, op.Parent, 10)
		}
		dst = append(dst, `,"blocks":[`...)
		for i, b := range op.Blocks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '[')
			if op.Contents != nil {
				dst = appendUints(dst, op.Contents[i])
			} else {
				dst = strconv.AppendUint(dst, b[0], 10)
			}
			dst = append(dst, ',')
			dst = strconv.AppendUint(dst, b[1], 10)
			dst = append(dst, ']')
		}
		dst = append(dst, ']')
	case Removed, Copied:
		dst = appendMedium(dst, op.Tier)
		dst = appendGroup(dst, op.Group)
		dst = append(dst, `,"seqs":`...)
		dst = appendUints(dst, op.Seqs)
	case Groups:
		dst = append(dst, `,"unit":`...)
		dst = strconv.AppendInt(dst, int64(op.Unit), 10)
		dst = append(dst, `,"groups":[`...)
		for i, g := range op.GroupSpecs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"kind":`...)
			dst = appendString(dst, g.Kind)
			dst = append(dst, `,"block_size":`...)
			dst = strconv.AppendInt(dst, int64(g.BlockSize), 10)
			if g.HasWindow {
				dst = append(dst, `,"window":`...)
				dst = strconv.AppendInt(dst, int64(g.Window), 10)
			}
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	case Query:
		dst = append(dst, `,"content":`...)
		dst = appendUints(dst, op.Content)
		if op.HasExpect {
			dst = append(dst, `,"expect":`...)
			dst = appendCounts(dst, op.Expect)
			dst = append(dst, `,"sizes":`...)
			dst = appendCounts(dst, op.Sizes)
			if op.Tiers != nil {
				dst = append(dst, `,"tiers":`...)
				dst = appendTiers(dst, op.Tiers)
			}
		}
	}
	return append(dst, "}\n"...)
}

func appendUints(dst []byte, v []uint64) []byte {
	dst = append(dst, '[')
	for i, x := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, x, 10)
	}
	return append(dst, ']')
}

// sortedKeys returns m's keys in order, so that equal ops give equal bytes.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func appendCounts(dst []byte, m map[string]int) []byte {
	dst = append(dst, '{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, k)
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, int64(m[k]), 10)
	}
	return append(dst, '}')
}

// appendGroup writes an op's group; group 0 is the default and is not written, so logs
// without groups read and write as before.
func appendGroup(dst []byte, group int) []byte {
	if group == 0 {
		return dst
	}
	dst = append(dst, `,"group":`...)
	return strconv.AppendInt(dst, int64(group), 10)
}

// appendMedium writes a stored or removed op's medium; the device tier is the default
// and is not written, so logs without media read and write as before.
func appendMedium(dst []byte, tier uint8) []byte {
	if tier == 0 || int(tier) >= len(TierNames) {
		return dst
	}
	dst = append(dst, `,"medium":`...)
	return appendString(dst, TierNames[tier])
}

func appendTiers(dst []byte, m map[string][3]int) []byte {
	dst = append(dst, '{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, k)
		dst = append(dst, ":["...)
		for j, v := range m[k] {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(v), 10)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func appendString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}
