package readlimit

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
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

// TestReadAllFile: a regular file reads as its bytes from the offset it is at, at every
// size around the limit; one past the limit fails without being read (a sparse file of
// 1 GiB allocates nothing), and the file's buffer is allocated once.
func TestReadAllFile(t *testing.T) {
	dir := t.TempDir()
	const max = 4096
	for _, size := range []int{0, 1, 511, 512, 513, max - 1, max, max + 1, 3 * max} {
		for _, off := range []int64{0, 1, 600} {
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i*7 + size)
			}
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, want, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Seek(off, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			got, err := ReadAll(f, max)
			f.Close()
			rest := want[min(int(off), size):]
			switch {
			case len(rest) > max:
				if !errors.Is(err, ErrTooLarge) {
					t.Errorf("%d bytes at %d: err %v, want ErrTooLarge", size, off, err)
				}
			case err != nil || !bytes.Equal(got, rest):
				t.Errorf("%d bytes at %d: got %d bytes, err %v, want %d bytes", size, off, len(got), err, len(rest))
			}
		}
	}

	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = ReadAll(f, 16<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1 GiB file, limit 16 MiB: err %v, want ErrTooLarge", err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 1<<20 {
		t.Errorf("refusing a 1 GiB file allocated %d bytes: it was read", grown)
	}

	mid := filepath.Join(dir, "mid")
	if err := os.WriteFile(mid, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(mid)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	runtime.ReadMemStats(&before)
	data, err := ReadAll(g, 16<<20)
	runtime.ReadMemStats(&after)
	if err != nil || len(data) != 1<<20 {
		t.Fatalf("1 MiB file: %d bytes, err %v", len(data), err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 1<<20+64<<10 {
		t.Errorf("reading a 1 MiB file allocated %d bytes: the buffer grew instead of being sized once", grown)
	}
}
