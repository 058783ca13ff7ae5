package readlimit

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReadAll(t *testing.T) {
	for _, tc := range []struct {
		in      string
		max     int64
		tooLong bool
	}{
		{"", 0, false},
		{"abc", 0, false},
		{"abc", 3, false},
		{"abcd", 3, true},
		{"abc", 100, false},
		{strings.Repeat("x", 1<<20), 1 << 10, true},
	} {
		got, err := ReadAll(strings.NewReader(tc.in), tc.max)
		switch {
		case tc.tooLong && !errors.Is(err, ErrTooLarge):
			t.Errorf("%d bytes, max %d: err %v, want ErrTooLarge", len(tc.in), tc.max, err)
		case !tc.tooLong && (err != nil || string(got) != tc.in):
			t.Errorf("%d bytes, max %d: got %d bytes, err %v", len(tc.in), tc.max, len(got), err)
		}
	}
}
