package kvevents

import (
	"math"
	"testing"
)

// TestFastPathsMatchTheGenericReader checks skip's shortcut for scalar array elements
// and uint32Fast against the generic reader, for every format byte followed by every
// length of payload up to 9 bytes (with two fillers, so that lengths and values vary):
// the same error or the same value and the same offset.
func TestFastPathsMatchTheGenericReader(t *testing.T) {
	for c := range 256 {
		for _, fill := range []byte{0x00, 0xff} {
			for n := 0; n <= 9; n++ {
				elem := []byte{byte(c)}
				for range n {
					elem = append(elem, fill)
				}
				// skip of a one-element array (the shortcut) against skip of the element.
				arr := reader{b: append([]byte{0x91}, elem...), maxDepth: 4}
				one := reader{b: elem, maxDepth: 4}
				ea, eo := arr.skip(1), one.skip(2)
				if ea != eo || ea == rOK && arr.off != one.off+1 {
					t.Fatalf("% x: array skip (%v, off %d), element skip (%v, off %d)", elem, ea, arr.off, eo, one.off)
				}
				// uint32Fast against intIn(0, MaxUint32).
				fast := reader{b: elem}
				gen := reader{b: elem}
				v, ok := fast.uint32Fast()
				g, e := gen.intIn(0, math.MaxUint32)
				switch {
				case ok && (e != rOK || int64(v) != g || fast.off != gen.off):
					t.Fatalf("% x: uint32Fast %d (off %d), intIn %d, %v (off %d)", elem, v, fast.off, g, e, gen.off)
				case !ok && fast.off != 0:
					t.Fatalf("% x: uint32Fast declined but moved to %d", elem, fast.off)
				}
			}
		}
	}
}
