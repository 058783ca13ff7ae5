package wire

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestExtraKeysBoundedBeforeDecoding: an extra_keys list far longer than its query's
// blocks (a 1 MiB body of empty entries for a 4-block query), or one entry far larger
// than a block's keys may be, is refused after a scan that allocates almost nothing;
// decoding the whole list first cost ~35 MB and ~0.4 s per 1 MiB request.
func TestExtraKeysBoundedBeforeDecoding(t *testing.T) {
	long := []byte("[" + strings.Repeat("[],", 1<<20/3) + "[]]")
	huge := []byte(`[["` + strings.Repeat("x", 1<<20) + `"]]`)
	for name, raw := range map[string][]byte{"entries": long, "entry": huge} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ParseExtraKeys(raw, 4)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
			t.Fatalf("%s: %d bytes allocated refusing it (%v)", name, alloc, err)
		}
	}
	// Within the bounds, every entry decodes as before.
	keys, err := ParseExtraKeys([]byte(` [ ["a"] , null , [] , [1, ["b", 7]] ] `), 4)
	if err != nil || len(keys) != 4 || keys[1] != nil || keys[2] != nil || !bytes.Equal(keys[0], []byte{0x81, 0x61, 'a'}) {
		t.Fatalf("keys %x, err %v", keys, err)
	}
	for _, bad := range []string{`[`, `[]]`, `[["a"],]`, `[["a"] ["b"]]`, `{}`, `[,]`} {
		if _, err := ParseExtraKeys([]byte(bad), 4); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}
