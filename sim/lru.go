package sim

// lruList is an intrusive doubly linked list over slots [0, n), indexed by slot, with its
// sentinel at n: the sentinel's next is the head (least recently pushed), its prev the
// tail. A slot off the list has links none. The mock engine's free queue and the host
// tier's LRU order are both one.
type lruList []link

// link is one slot's place in an lruList.
type link struct{ prev, next int32 }

// newLRUList returns an empty list over n slots.
func newLRUList(n int) lruList {
	l := make(lruList, n+1)
	for i := range l {
		l[i] = link{prev: none, next: none}
	}
	s := int32(n)
	l[s] = link{prev: s, next: s}
	return l
}

func (l lruList) sentinel() int32 { return int32(len(l) - 1) }

// head returns the least recently pushed slot, or false when the list is empty.
func (l lruList) head() (int32, bool) {
	h := l[l.sentinel()].next
	return h, h != l.sentinel()
}

// pushTail appends slot i, which is off the list.
func (l lruList) pushTail(i int32) {
	s := l.sentinel()
	last := l[s].prev
	l[i] = link{prev: last, next: s}
	l[last].next = i
	l[s].prev = i
}

// unlink takes slot i, which is on the list, off it.
func (l lruList) unlink(i int32) {
	p, n := l[i].prev, l[i].next
	l[p].next = n
	l[n].prev = p
	l[i] = link{prev: none, next: none}
}
