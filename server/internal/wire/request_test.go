package wire

import "testing"

// TestDecodeMatch: the reader's strict rules, one body each (FuzzDecodeMatch in package
// server holds it to encoding/json on everything else).
func TestDecodeMatch(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{}`, true},
		{` { "model" : "m" , "tokens" : [ 1 , 2 ,3 ] } `, true},
		{`{"model":"m\u00e9\n","namespace":null,"content_hashes":["18446744073709551615","0xff",7]}`, true},
		{`{"tokens":null,"content_hashes":[]}`, true},
		{`{"tokens":[4294967296]}`, false},
		{`{"tokens":["1"]}`, false},
		{`{"tokens":[-1]}`, false},
		{`{"tokens":[1.5]}`, false},
		{`{"tokens":[01]}`, false},
		{`{"tokens":[1,]}`, false},
		{`{"tokens":[1 2]}`, false},
		{`{"content_hashes":["18446744073709551616"]}`, false},
		{`{"content_hashes":["0x1ffffffffffffffff"]}`, false},
		{`{"model":1}`, false},
		{`{"model":"m",}`, false},
		{`{"x":1}`, false},
		{`{"model":"m"} {}`, false},
		{`[]`, false},
		{`{"model":"a`, false},
		{`{"model":"a\u0001"}`, true},
		{"{\"model\":\"a\x01\"}", false},
	} {
		var r Request
		err := DecodeMatch([]byte(tc.in), &r)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}
