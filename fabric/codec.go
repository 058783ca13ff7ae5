package fabric

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/engine"
)

// Message is one normalised engine event as it travels through the stream: the event
// and its position in its worker's event sequence (1, 2, 3, ... as the relay numbered
// them; 0 means unnumbered, never deduplicated by a replica). An event too large for one
// NATS message travels in parts, all with the event's WorkerSeq, each a valid event of
// its own: a store's blocks in runs, each run's parent the previous run's last block; a
// removal's or copy's seqs in runs. A part carries the event's items (blocks or seqs)
// from Offset on, of Total in the event; Total 0 is a whole event. Parts say where
// they lie rather than their number, so that a relay that sends an event again after a
// restart, cut in other places (another max_payload), overlaps what a replica applied
// instead of contradicting it.
type Message struct {
	WorkerSeq     uint64
	Offset, Total uint32
	Event         engine.Event
}

// items returns how many blocks (a store) or seqs (a removal, a copy) ev carries.
func items(ev *engine.Event) int {
	if ev.Kind == engine.EventStored {
		return len(ev.Blocks)
	}
	return len(ev.Seqs)
}

// codecVersion is the first byte of every encoded message.
const codecVersion = 1

// Limits of the decoder: a message that claims more is refused before anything is
// allocated for it.
const (
	// MaxNameBytes bounds a worker or namespace name.
	MaxNameBytes = 1 << 16
	// MaxMessageBytes bounds an encoded message (the default max_payload of a NATS
	// server is 1 MiB; a store of 1<<16 blocks is 1 MiB of blocks).
	MaxMessageBytes = 64 << 20
)

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("fabric: malformed message")

// The flags byte: bit 0 HasParent, bits 1-2 the event's tier (engine.Tier; 0, the
// device, for every message written before tiers, so those decode as before). A
// decoder from before tiers refuses a message with tier bits (unknown flags) rather
// than take a host or disk event for a device one.
//
// Bit 3 marks a part of a split event: its offset and the event's total follow the
// worker sequence (a decoder from before splitting refuses it, as above).
const (
	flagHasParent = 1
	flagTierShift = 1
	flagTierMask  = 3 << flagTierShift
	flagPart      = 1 << 3
)

// MaxSplitTotal bounds the items of a split event.
const MaxSplitTotal = engine.MaxDepth

// AppendMessage appends the binary form of m to dst:
//
//	version u8 | kind u8 | flags u8 (HasParent, tier, part) | workerSeq uvarint |
//	[offset uvarint | total uvarint, with the part flag] | worker (uvarint len, bytes)
//	| namespace (uvarint len, bytes) | parent u64le | nblocks uvarint | (content u64le,
//	seq u64le)* | nseqs uvarint | seq u64le*
//
// Hashes are fixed 8 bytes: they are uniformly random, a varint would only grow them.
func AppendMessage(dst []byte, m *Message) []byte {
	ev := &m.Event
	var flags byte
	if ev.HasParent {
		flags |= flagHasParent
	}
	flags |= byte(ev.Tier) << flagTierShift & flagTierMask
	if m.Total != 0 {
		flags |= flagPart
	}
	dst = append(dst, codecVersion, byte(ev.Kind), flags)
	dst = binary.AppendUvarint(dst, m.WorkerSeq)
	if m.Total != 0 {
		dst = binary.AppendUvarint(dst, uint64(m.Offset))
		dst = binary.AppendUvarint(dst, uint64(m.Total))
	}
	dst = binary.AppendUvarint(dst, uint64(len(ev.Worker)))
	dst = append(dst, ev.Worker...)
	dst = binary.AppendUvarint(dst, uint64(len(ev.Namespace)))
	dst = append(dst, ev.Namespace...)
	dst = binary.LittleEndian.AppendUint64(dst, ev.Parent)
	dst = binary.AppendUvarint(dst, uint64(len(ev.Blocks)))
	for _, b := range ev.Blocks {
		dst = binary.LittleEndian.AppendUint64(dst, b.Content)
		dst = binary.LittleEndian.AppendUint64(dst, b.Seq)
	}
	dst = binary.AppendUvarint(dst, uint64(len(ev.Seqs)))
	for _, s := range ev.Seqs {
		dst = binary.LittleEndian.AppendUint64(dst, s)
	}
	return dst
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) str(what string) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > MaxNameBytes || n > uint64(len(d.b)) {
		d.fail("%s of %d bytes", what, n)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// count reads a count of items of size bytes each and checks the rest holds them.
func (d *decoder) count(size int, what string) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)/size) {
		d.fail("%d %s do not fit in %d bytes", n, what, len(d.b))
		return 0
	}
	return int(n)
}

// DecodeMessage decodes one message into m, reusing m's slices. It never panics and
// allocates at most in proportion to len(b); every error wraps ErrMalformed.
func DecodeMessage(b []byte, m *Message) error {
	if len(b) > MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != codecVersion {
		return fmt.Errorf("%w: version %d, this build reads version %d", ErrMalformed, v, codecVersion)
	}
	kind := engine.EventKind(d.byte())
	flags := d.byte()
	if d.err == nil {
		if kind < engine.EventStored || kind > engine.EventCopied {
			d.fail("unknown kind %d", kind)
		}
		if flags&^(flagHasParent|flagTierMask|flagPart) != 0 {
			d.fail("unknown flags %#x", flags)
		}
		if t := flags & flagTierMask >> flagTierShift; t >= engine.NumTiers {
			d.fail("unknown tier %d", t)
		}
	}
	seq := d.uvarint()
	var offset, total uint64
	if flags&flagPart != 0 {
		offset, total = d.uvarint(), d.uvarint()
		if d.err == nil && (total > MaxSplitTotal || offset >= total) {
			d.fail("part at %d of %d", offset, total)
		}
	}
	worker := d.str("worker")
	ns := d.str("namespace")
	parent := d.u64()
	nb := d.count(16, "blocks")
	blocks := m.Event.Blocks[:0]
	if d.err == nil {
		blocks = grow(blocks, nb)
		for i := 0; i < nb; i++ {
			blocks = append(blocks, engine.Block{Content: d.u64(), Seq: d.u64()})
		}
	}
	ns2 := d.count(8, "seqs")
	seqs := m.Event.Seqs[:0]
	if d.err == nil {
		seqs = grow(seqs, ns2)
		for i := 0; i < ns2; i++ {
			seqs = append(seqs, d.u64())
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err == nil && worker == "" {
		d.fail("empty worker")
	}
	if d.err != nil {
		return d.err
	}
	if nb == 0 {
		blocks = nil
	}
	if ns2 == 0 {
		seqs = nil
	}
	m.WorkerSeq, m.Offset, m.Total = seq, uint32(offset), uint32(total)
	m.Event = engine.Event{
		Kind: kind, Worker: worker, Namespace: ns,
		Parent: parent, HasParent: flags&flagHasParent != 0,
		Blocks: blocks, Seqs: seqs, Tier: engine.Tier(flags & flagTierMask >> flagTierShift),
	}
	if total != 0 {
		// A part: of a kind that splits, its items inside the event, fewer than all.
		n := uint64(items(&m.Event))
		if kind != engine.EventStored && kind != engine.EventRemoved && kind != engine.EventCopied || n == 0 || offset+n > total || n == total {
			return fmt.Errorf("%w: a part of %d items at %d of %d, kind %d", ErrMalformed, n, offset, total, kind)
		}
	}
	return nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s
}

// Token escapes a name into one NATS subject token: "_" for the empty name, else
// lowercase hex of its bytes (NATS tokens cannot hold spaces, dots or wildcards, and
// hex keeps them ASCII and case-insensitive-safe).
func Token(name string) string {
	if name == "" {
		return "_"
	}
	return hex.EncodeToString([]byte(name))
}

// untoken inverts Token.
func untoken(tok string) (string, error) {
	if tok == "_" {
		return "", nil
	}
	b, err := hex.DecodeString(tok)
	if err != nil || len(b) == 0 {
		return "", fmt.Errorf("fabric: %q is not a subject token", tok)
	}
	return string(b), nil
}

// tokenIs reports whether tok == Token(name), without building Token(name).
func tokenIs(tok, name string) bool {
	if name == "" {
		return tok == "_"
	}
	const digits = "0123456789abcdef"
	if len(tok) != 2*len(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if tok[2*i] != digits[name[i]>>4] || tok[2*i+1] != digits[name[i]&15] {
			return false
		}
	}
	return true
}

// DefaultSubjectPrefix is the subject prefix of the event stream.
const DefaultSubjectPrefix = "kvindex.events"

// Subject returns the subject of a worker's events: prefix.<model>.<worker>.
func Subject(prefix, model, worker string) string {
	return prefix + "." + Token(model) + "." + Token(worker)
}

// MsgID returns the JetStream message id (Nats-Msg-Id) of a worker's event: the
// worker's token, ':' and its sequence. Ids are unique per worker and sequence across
// models too, as the engine keys workers by name alone.
func MsgID(worker string, seq uint64) string {
	return Token(worker) + ":" + fmt.Sprint(seq)
}

// partMsgID is the message id of the part at offset of a split event: MsgID + "." +
// offset.
func partMsgID(worker string, seq uint64, offset uint32) string {
	return MsgID(worker, seq) + "." + fmt.Sprint(offset)
}
