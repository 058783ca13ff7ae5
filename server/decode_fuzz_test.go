package server

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/server/internal/wire"
)

// FuzzDecodeMatch holds the single-pass reader to encoding/json: whatever it accepts,
// encoding/json (strict) decodes to the same request.
func FuzzDecodeMatch(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","tokens":[1,2,3]}`,
		`{"model":"m","namespace":"lora=a","content_hashes":[1,"2","0x3"],"policy":"random"}`,
		`{"lora_name":"x\"y","cache_salt":"\\u00e9","tokens":[]}`,
		`{"tokens":null}`,
		`{"tokens":[1,2,3,4],"extra_keys":[["a",1,[2,"b"]],null,[{"bytes_hex":"00ff"}]]}`,
		`{"tokens":[1],"extra_keys":null}`,
		`{"model":"m","tokens":[1,2,3,4],"tier_weights":[1,0.75,0.25]}`,
		`{"tokens":[1],"tier_weights":[ 0 , 1e-3,-0.0E+1 ]}`,
		`{"tokens":[1],"tier_weights":null,"record":true}`,
		`{"tokens":[1],"tier_weights":[1,2]}`,
		`{"tokens":[1,2],"policy":"cost","pick":true,"request_id":"r-1","load":{"a":{"waiting":3,"kv_util":0.5},"b":{}}}`,
		`{"tokens":[1,2],"pick":false,"load":null,"request_id":null}`,
		`{"tokens":[1,2],"load":{"a":{"tokens":-1}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r wire.Request
		if wire.DecodeMatch(b, &r) != nil {
			return
		}
		// The handler reads "load" next: what it refuses, the request is refused for.
		loads, err := decodeLoads(r.Load)
		if err != nil {
			return
		}
		_ = checkLoads(loads) // never a panic
		var want MatchRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("%q: accepted here, encoding/json says %v", b, err)
		}
		if r.Model != want.Model || r.Namespace != want.Namespace || r.LoraName != want.LoraName ||
			r.CacheSalt != want.CacheSalt || r.Policy != want.Policy {
			t.Fatalf("%q: strings %+v vs %+v", b, r, want)
		}
		if r.HasTokens != (want.Tokens != nil) || r.HasHashes != (want.ContentHashes != nil) {
			t.Fatalf("%q: presence %v %v vs %v %v", b, r.HasTokens, r.HasHashes, want.Tokens != nil, want.ContentHashes != nil)
		}
		hs := make([]uint64, len(want.ContentHashes))
		for i, v := range want.ContentHashes {
			hs[i] = uint64(v)
		}
		if !slices.Equal(r.Tokens, want.Tokens) || !slices.Equal(r.Hashes, hs) {
			t.Fatalf("%q: arrays %v %v vs %v %v", b, r.Tokens, r.Hashes, want.Tokens, hs)
		}
		if r.Record != want.Record || r.Pick != want.Pick || r.RequestID != want.RequestID {
			t.Fatalf("%q: record, pick, request_id %v %v %q vs %v %v %q", b, r.Record, r.Pick, r.RequestID, want.Record, want.Pick, want.RequestID)
		}
		if len(loads) != len(want.Load) {
			t.Fatalf("%q: load %v vs %v", b, loads, want.Load)
		}
		for w, l := range loads {
			wl, ok := want.Load[w]
			if !ok || !reflect.DeepEqual(*l, wl) {
				t.Fatalf("%q: load of %q %+v vs %+v", b, w, l, wl)
			}
		}
		kept := min(r.NWeights, len(r.Weights))
		if r.HasWeights != (want.TierWeights != nil) || (r.HasWeights && (r.NWeights != len(want.TierWeights) ||
			!slices.Equal(r.Weights[:kept], want.TierWeights[:kept]))) {
			t.Fatalf("%q: tier_weights %v %d %v vs %v", b, r.HasWeights, r.NWeights, r.Weights, want.TierWeights)
		}
		if r.HasWeights {
			// The pipeline's check: never a panic, and what it accepts is in range.
			if w, e := checkWeights(r.Weights[:], r.NWeights); e == nil && w.Validate() != nil {
				t.Fatalf("%q: weights %v accepted", b, w)
			}
		}
		if r.ExtraKeys != nil {
			// Never a panic; every accepted block key is bounded.
			keys, err := wire.ParseExtraKeys(r.ExtraKeys, 64)
			for _, k := range keys {
				if err == nil && len(k) > wire.MaxKeyBytes {
					t.Fatalf("%q: key of %d bytes", b, len(k))
				}
			}
		}
	})
}

func TestCheckNamespace(t *testing.T) {
	for _, ns := range []string{"", "lora=a", "lora_id=7", "salt=s", "lora=a;salt=s", "lora_id=12;salt=%25x",
		"lora_id=0", "lora_id=-3", "lora_id=18446744073709551615", "lora_id=-9223372036854775808",
		kvevents.Namespace("we;ird%", "sa\x01lt"), kvevents.Namespace("", "x;y")} {
		if err := checkNamespace(ns); err != nil {
			t.Errorf("%q: %v", ns, err)
		}
	}
	for _, ns := range []string{"x", "lora=", "salt=", "lora=a;", ";salt=s", "salt=s;lora=a", "lora=a;salt=s;x=1",
		"lora=a%", "lora=a%2", "lora=a%zz", "lora=a%2f", "lora_id=", "lora_id=01",
		"lora_id=-", "lora_id=-0", "lora_id=-01", "lora_id=+1", "lora_id=18446744073709551616", "lora_id=-9223372036854775809", "lora=\x01", "LORA=a"} {
		if err := checkNamespace(ns); err == nil {
			t.Errorf("%q accepted", ns)
		}
	}
}

// FuzzDecodeRouted checks the routed request's reader as FuzzDecodeMatch checks the
// match request's: what it accepts, encoding/json reads alike.
func FuzzDecodeRouted(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","worker":"w","tokens":[1,2,3],"ttl_ms":500}`,
		`{"model":"m","worker":"w","content_hashes":[1,"2","0x3"],"ttl_ms":null,"namespace":"lora=a"}`,
		`{"worker":"w\"x","tokens":[1],"ttl_ms":600000}`,
		`{"worker":"w","tokens":[1],"ttl_ms":1,"ttl_ms":2}`,
		`{"worker":"w","tokens":[1],"request_id":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r wire.Request
		if wire.Decode(b, &r, wire.KindRouted) != nil {
			return
		}
		var want RoutedRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("%q: accepted here, encoding/json says %v", b, err)
		}
		if r.Model != want.Model || r.Worker != want.Worker || r.Namespace != want.Namespace ||
			r.LoraName != want.LoraName || r.CacheSalt != want.CacheSalt || r.TTLms != want.TTLms || r.RequestID != want.RequestID {
			t.Fatalf("%q: fields %+v vs %+v", b, r, want)
		}
		if len(r.Tokens) != len(want.Tokens) || len(r.Hashes) != len(want.ContentHashes) {
			t.Fatalf("%q: arrays %d %d vs %d %d", b, len(r.Tokens), len(r.Hashes), len(want.Tokens), len(want.ContentHashes))
		}
	})
}
