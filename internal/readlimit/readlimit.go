// Package readlimit reads a whole input of bounded size: the snapshot readers of engine
// and fabric use it, so that a damaged or hostile input cannot make them allocate
// without bound.
package readlimit

import (
	"errors"
	"fmt"
	"io"
)

// ErrTooLarge is returned when an input has more than the limit's bytes.
var ErrTooLarge = errors.New("readlimit: input too large")

// ReadAll reads r to its end. With max > 0 it reads at most max+1 bytes and fails with
// ErrTooLarge (wrapped) when there were more than max; max <= 0 means no limit.
func ReadAll(r io.Reader, max int64) ([]byte, error) {
	if max > 0 {
		r = io.LimitReader(r, max+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if max > 0 && int64(len(data)) > max {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, max)
	}
	return data, nil
}
