package tokenize_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seedFromEnv returns KVINDEX_TOKENIZE_SEED, or a fresh seed; either is logged.
func seedFromEnv(t testing.TB) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KVINDEX_TOKENIZE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KVINDEX_TOKENIZE_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (KVINDEX_TOKENIZE_SEED=%d reproduces)", seed, seed)
	return seed
}
