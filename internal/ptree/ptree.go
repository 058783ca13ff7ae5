package ptree

import "iter"

// Key is what a Map can be keyed by: integers and strings, compared with < (floats are
// left out: NaN has no place in an order).
type Key interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr | ~string
}

// The B-tree's order (CLRS's minimum degree t): a node holds t-1 to 2t-1 items (the
// root at least one), an inner node one child more than items.
const (
	degree   = 8
	maxItems = 2*degree - 1
	minItems = degree - 1
)

// Map is an immutable ordered map from K to V. The zero Map is empty and ready to
// use. A Map is a value: Set and Delete return a new one and leave the receiver (and
// every Map made before) unchanged, so any number of goroutines may read one Map while
// another makes the next.
type Map[K Key, V any] struct {
	root *node[K, V]
	n    int
}

// edit marks the nodes one Builder (or one Set or Delete) made: those it may change in
// place. It has a size so that two edits never share an address.
type edit struct{ _ byte }

type node[K Key, V any] struct {
	edit *edit // the edit that made the node; nil once published (never changed again)
	n    int   // items held
	keys [maxItems]K
	vals [maxItems]V
	kids [maxItems + 1]*node[K, V] // all nil in a leaf
}

// Len returns the number of entries.
func (m Map[K, V]) Len() int { return m.n }

// Get returns k's value and whether k is present.
func (m Map[K, V]) Get(k K) (V, bool) {
	for x := m.root; x != nil; {
		i, found := x.search(k)
		if found {
			return x.vals[i], true
		}
		x = x.kids[i]
	}
	var zero V
	return zero, false
}

// Set returns m with k mapped to v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	b := Builder[K, V]{m: m}
	b.Set(k, v)
	return b.Map()
}

// Delete returns m without k (m itself when k is absent).
func (m Map[K, V]) Delete(k K) Map[K, V] {
	b := Builder[K, V]{m: m}
	b.Delete(k)
	return b.Map()
}

// All yields the entries in ascending key order.
func (m Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) { m.root.walk(yield) }
}

// Keys yields the keys in ascending order.
func (m Map[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		m.root.walk(func(k K, _ V) bool { return yield(k) })
	}
}

// Values yields the values in ascending key order.
func (m Map[K, V]) Values() iter.Seq[V] {
	return func(yield func(V) bool) {
		m.root.walk(func(_ K, v V) bool { return yield(v) })
	}
}

// Builder makes a Map by a series of changes, copying each node at most once however
// many changes touch it (a Map's Set copies the nodes on the key's path every time).
// The zero Builder starts from the empty Map; Map.Edit from a given one. A Builder is
// owned by one goroutine; the Maps it returns may be shared.
type Builder[K Key, V any] struct {
	m Map[K, V]
	e *edit
}

// Edit returns a Builder starting from m (m stays unchanged).
func (m Map[K, V]) Edit() *Builder[K, V] { return &Builder[K, V]{m: m} }

// Map returns the Map built so far. Later changes through b leave it unchanged.
func (b *Builder[K, V]) Map() Map[K, V] {
	b.e = nil // the nodes made so far are published
	return b.m
}

// Len returns the number of entries built so far.
func (b *Builder[K, V]) Len() int { return b.m.n }

// Get returns k's value in the Map built so far.
func (b *Builder[K, V]) Get(k K) (V, bool) { return b.m.Get(k) }

func (b *Builder[K, V]) token() *edit {
	if b.e == nil {
		b.e = new(edit)
	}
	return b.e
}

// Set maps k to v.
func (b *Builder[K, V]) Set(k K, v V) {
	e := b.token()
	root := b.m.root
	switch {
	case root == nil:
		root = &node[K, V]{edit: e, n: 1}
		root.keys[0], root.vals[0] = k, v
		b.m = Map[K, V]{root: root, n: 1}
		return
	case root.n == maxItems:
		up := &node[K, V]{edit: e}
		up.kids[0] = root
		up.splitChild(e, 0)
		root = up
	default:
		root = root.mut(e)
	}
	b.m.root = root
	if root.set(e, k, v) {
		b.m.n++
	}
}

// Delete removes k (nothing when it is absent).
func (b *Builder[K, V]) Delete(k K) {
	if _, ok := b.m.Get(k); !ok {
		return // nothing copied or rebalanced for an absent key
	}
	e := b.token()
	root := b.m.root.mut(e)
	root.delete(e, k)
	b.m.n--
	switch {
	case root.n > 0:
	case root.kids[0] != nil:
		root = root.kids[0] // the root's last item went down into a merge
	default:
		root = nil
	}
	b.m.root = root
}

// mut returns x itself when e made it, else a copy of x that e owns.
func (x *node[K, V]) mut(e *edit) *node[K, V] {
	if x.edit == e {
		return x
	}
	c := *x
	c.edit = e
	return &c
}

func (x *node[K, V]) leaf() bool { return x.kids[0] == nil }

// search returns the index of the first key >= k and whether it is k.
func (x *node[K, V]) search(k K) (int, bool) {
	lo, hi := 0, x.n
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		if x.keys[h] < k {
			lo = h + 1
		} else {
			hi = h
		}
	}
	return lo, lo < x.n && x.keys[lo] == k
}

// walk yields x's entries in order; false when yield stopped it.
func (x *node[K, V]) walk(yield func(K, V) bool) bool {
	if x == nil {
		return true
	}
	for i := range x.n {
		if !x.kids[i].walk(yield) || !yield(x.keys[i], x.vals[i]) {
			return false
		}
	}
	return x.kids[x.n].walk(yield)
}

// set maps k to v under x (owned by e, not full); true when k is new.
func (x *node[K, V]) set(e *edit, k K, v V) bool {
	for {
		i, found := x.search(k)
		if found {
			x.vals[i] = v
			return false
		}
		if x.leaf() {
			x.insertAt(i, k, v, nil)
			return true
		}
		if x.kids[i].n == maxItems {
			x.splitChild(e, i)
			switch {
			case k == x.keys[i]:
				x.vals[i] = v
				return false
			case k > x.keys[i]:
				i++
			}
		}
		x.kids[i] = x.kids[i].mut(e)
		x = x.kids[i]
	}
}

// splitChild splits x's full child i in two around its middle item, which moves up
// into x (owned by e, not full).
func (x *node[K, V]) splitChild(e *edit, i int) {
	y := x.kids[i].mut(e)
	z := &node[K, V]{edit: e, n: minItems}
	copy(z.keys[:], y.keys[degree:])
	copy(z.vals[:], y.vals[degree:])
	copy(z.kids[:], y.kids[degree:])
	mk, mv := y.keys[minItems], y.vals[minItems]
	y.n = minItems
	y.clearFrom(minItems)
	x.kids[i] = y
	x.insertAt(i, mk, mv, z)
}

// insertAt puts item (k, v) at index i of x, and right (nil in a leaf) as the child
// after it.
func (x *node[K, V]) insertAt(i int, k K, v V, right *node[K, V]) {
	copy(x.keys[i+1:x.n+1], x.keys[i:x.n])
	copy(x.vals[i+1:x.n+1], x.vals[i:x.n])
	x.keys[i], x.vals[i] = k, v
	if !x.leaf() {
		copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
		x.kids[i+1] = right
	}
	x.n++
}

// removeAt takes item i out of x and, in an inner node, the child after it.
func (x *node[K, V]) removeAt(i int) {
	copy(x.keys[i:], x.keys[i+1:x.n])
	copy(x.vals[i:], x.vals[i+1:x.n])
	if !x.leaf() {
		copy(x.kids[i+1:], x.kids[i+2:x.n+1])
	}
	x.n--
	x.clearFrom(x.n)
}

// clearFrom zeroes the slots from item i on, so that x keeps nothing it no longer
// holds alive.
func (x *node[K, V]) clearFrom(i int) {
	clear(x.keys[i:])
	clear(x.vals[i:])
	if !x.leaf() {
		clear(x.kids[i+1:])
	}
}

// delete removes k, present under x (owned by e; with more than minItems items unless
// it is the root), descending only into children that can lose an item.
func (x *node[K, V]) delete(e *edit, k K) {
	for {
		i, found := x.search(k)
		if x.leaf() {
			x.removeAt(i) // found: Builder.Delete checked k is present
			return
		}
		if found {
			switch {
			case x.kids[i].n > minItems: // replace by the predecessor, then delete it
				c := x.kids[i].mut(e)
				x.kids[i] = c
				x.keys[i], x.vals[i] = c.last()
				k = x.keys[i]
				x = c
				continue
			case x.kids[i+1].n > minItems: // by the successor
				c := x.kids[i+1].mut(e)
				x.kids[i+1] = c
				x.keys[i], x.vals[i] = c.first()
				k = x.keys[i]
				x = c
				continue
			}
			x.merge(e, i) // k moves down into the merged child
			x = x.kids[i]
			continue
		}
		x = x.fill(e, i)
	}
}

// fill returns x's child on k's path (index i), copied for e, with more than minItems
// items: one borrowed from a sibling through x, or the child merged with one.
func (x *node[K, V]) fill(e *edit, i int) *node[K, V] {
	if x.kids[i].n > minItems {
		x.kids[i] = x.kids[i].mut(e)
		return x.kids[i]
	}
	switch {
	case i > 0 && x.kids[i-1].n > minItems: // rotate from the left sibling
		l, c := x.kids[i-1].mut(e), x.kids[i].mut(e)
		x.kids[i-1], x.kids[i] = l, c
		copy(c.keys[1:c.n+1], c.keys[:c.n])
		copy(c.vals[1:c.n+1], c.vals[:c.n])
		c.keys[0], c.vals[0] = x.keys[i-1], x.vals[i-1]
		if !c.leaf() {
			copy(c.kids[1:c.n+2], c.kids[:c.n+1])
			c.kids[0] = l.kids[l.n]
		}
		c.n++
		x.keys[i-1], x.vals[i-1] = l.keys[l.n-1], l.vals[l.n-1]
		l.n--
		l.clearFrom(l.n)
		return c
	case i < x.n && x.kids[i+1].n > minItems: // rotate from the right sibling
		c, r := x.kids[i].mut(e), x.kids[i+1].mut(e)
		x.kids[i], x.kids[i+1] = c, r
		c.keys[c.n], c.vals[c.n] = x.keys[i], x.vals[i]
		c.kids[c.n+1] = r.kids[0]
		c.n++
		x.keys[i], x.vals[i] = r.keys[0], r.vals[0]
		if !r.leaf() {
			copy(r.kids[:], r.kids[1:r.n+1])
		}
		copy(r.keys[:], r.keys[1:r.n])
		copy(r.vals[:], r.vals[1:r.n])
		r.n--
		r.clearFrom(r.n)
		return c
	case i == x.n:
		i-- // the last child merges into its left sibling
	}
	x.merge(e, i)
	return x.kids[i]
}

// merge joins x's children i and i+1 (minItems items each) around x's item i into
// child i, copied for e.
func (x *node[K, V]) merge(e *edit, i int) {
	l, r := x.kids[i].mut(e), x.kids[i+1]
	l.keys[l.n], l.vals[l.n] = x.keys[i], x.vals[i]
	copy(l.keys[l.n+1:], r.keys[:r.n])
	copy(l.vals[l.n+1:], r.vals[:r.n])
	copy(l.kids[l.n+1:], r.kids[:r.n+1])
	l.n += 1 + r.n
	x.kids[i] = l
	x.removeAt(i)
}

// last returns the largest entry under x.
func (x *node[K, V]) last() (K, V) {
	for !x.leaf() {
		x = x.kids[x.n]
	}
	return x.keys[x.n-1], x.vals[x.n-1]
}

// first returns the smallest entry under x.
func (x *node[K, V]) first() (K, V) {
	for !x.leaf() {
		x = x.kids[0]
	}
	return x.keys[0], x.vals[0]
}
