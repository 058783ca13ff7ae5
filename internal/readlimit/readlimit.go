// Package readlimit reads a whole input of bounded size: the snapshot readers of engine
// and fabric and serve's engines file use it, so that a damaged or hostile input cannot
// make them allocate without bound.
package readlimit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
)

// ErrTooLarge is returned when an input has more than the limit's bytes.
var ErrTooLarge = errors.New("readlimit: input too large")

// ReadAll reads r to its end. With max > 0 it reads at most max+1 bytes and fails with
// ErrTooLarge (wrapped) when there were more than max; max <= 0 means no limit.
//
// When r is a regular file (it has Stat and Seek, as *os.File does), what is left of it
// is known before reading: more than max fails at once, without reading, and otherwise
// the buffer is allocated once at that size instead of io.ReadAll's doublings (which
// allocate about twice the input and copy it). The limit still holds if the file grows
// while it is read.
func ReadAll(r io.Reader, max int64) ([]byte, error) {
	left := remaining(r)
	if max > 0 && left > max {
		return nil, tooLarge(max)
	}
	if max > 0 {
		r = io.LimitReader(r, max+1)
	}
	var data []byte
	var err error
	if left >= 0 && left <= math.MaxInt-bytes.MinRead { // a size that fits an int (386)
		data, err = readSized(r, left)
	} else {
		data, err = io.ReadAll(r)
	}
	if err != nil {
		return nil, err
	}
	if max > 0 && int64(len(data)) > max {
		return nil, tooLarge(max)
	}
	return data, nil
}

func tooLarge(max int64) error {
	return fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, max)
}

// remaining returns the bytes left to read in r when r is a regular file (its size less
// its offset), and -1 when that is not known.
func remaining(r io.Reader) int64 {
	f, ok := r.(interface {
		Stat() (fs.FileInfo, error)
		io.Seeker
	})
	if !ok {
		return -1
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return -1
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil || off > st.Size() {
		return -1
	}
	return st.Size() - off
}

// readSized reads r to its end into a buffer sized for the size bytes expected, with
// bytes.MinRead more so that the read that finds the end does not grow it (bytes.Buffer
// grows a full buffer by at least MinRead before each read); a file that grew meanwhile
// grows it.
func readSized(r io.Reader, size int64) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(int(size) + bytes.MinRead)
	if _, err := b.ReadFrom(r); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
