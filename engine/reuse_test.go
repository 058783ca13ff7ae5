package engine_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/engine"
	"github.com/stretchr/testify/require"
)

// TestMatchesOverwriteSpare: FindMatches writes its answers in place into dst's spare
// capacity (collect, field by field), so nothing a caller's reused slice held before
// may show through: every field of every Match is set to junk first (by reflection,
// so a field added to Match and not written there fails this test) and the answer
// must equal the one into a fresh slice, on the locked index and on shards.
func TestMatchesOverwriteSpare(t *testing.T) {
	for _, cfg := range []engine.Config{{LockedIndex: true}, {Shards: 2}} {
		e := newEngine(t, cfg)
		for w, n := range map[string]int{"a": 5, "b": 3} {
			blocks := make([]engine.Block, n)
			for i := range blocks {
				blocks[i] = engine.Block{Content: uint64(10 + i), Seq: uint64(100*len(w) + i + 1)}
			}
			require.NoError(t, e.Store(w, blocks))
		}
		require.NoError(t, e.Barrier(context.Background()))
		q := []uint64{10, 11, 12, 13, 14}
		want, err := e.FindMatches(context.Background(), q, nil)
		require.NoError(t, err)
		require.Len(t, want, 2)

		spare := make([]engine.Match, 4)
		for i := range spare {
			junk(t, reflect.ValueOf(&spare[i]).Elem())
		}
		got, err := e.FindMatches(context.Background(), q, spare[:1])
		require.NoError(t, err)
		require.Equal(t, spare[0], got[0], "the caller's element before the answer is kept")
		require.Equal(t, want, got[1:], "config %+v", cfg)
	}
}

// junk sets every field of v to a value no answer holds.
func junk(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int:
			f.SetInt(-7)
		case reflect.String:
			f.SetString("junk")
		case reflect.Array:
			for j := range f.Len() {
				f.Index(j).SetInt(-7)
			}
		default:
			t.Fatalf("Match.%s is a %s: give it junk here (and make sure collect writes it)", v.Type().Field(i).Name, f.Kind())
		}
	}
}
