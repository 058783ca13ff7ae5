package cbor

import (
	"encoding/hex"
	"math"
	"testing"
)

// Examples from RFC 8949, Appendix A.
func TestRFCExamples(t *testing.T) {
	for _, c := range []struct {
		got  []byte
		want string
	}{
		{AppendUint(nil, 0), "00"},
		{AppendUint(nil, 23), "17"},
		{AppendUint(nil, 24), "1818"},
		{AppendUint(nil, 100), "1864"},
		{AppendUint(nil, 1000), "1903e8"},
		{AppendUint(nil, 1000000), "1a000f4240"},
		{AppendUint(nil, 1000000000000), "1b000000e8d4a51000"},
		{AppendUint(nil, math.MaxUint64), "1bffffffffffffffff"},
		{AppendNegative(nil, math.MaxUint64), "3bffffffffffffffff"},
		{AppendInt(nil, -1), "20"},
		{AppendInt(nil, -100), "3863"},
		{AppendInt(nil, -1000), "3903e7"},
		{AppendInt(nil, 10), "0a"},
		{AppendBytes(nil, []byte{1, 2, 3, 4}), "4401020304"},
		{AppendText(nil, "IETF"), "6449455446"},
		{AppendText(nil, ""), "60"},
		{AppendNull(nil), "f6"},
		{AppendBool(nil, false), "f4"},
		{AppendBool(nil, true), "f5"},
		{AppendUint(AppendUint(AppendUint(AppendArray(nil, 3), 1), 2), 3), "83010203"},
		{AppendArray(nil, 25), "9819"},
	} {
		if h := hex.EncodeToString(c.got); h != c.want {
			t.Errorf("got %s, want %s", h, c.want)
		}
	}
}
