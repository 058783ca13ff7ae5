package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWrite: a write replaces the file whole; a failing write, or one into a missing
// directory, leaves the old file and no temporary file behind.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.snap")
	put := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	require.NoError(t, Write(path, put("first")))
	require.NoError(t, Write(path, put("second, longer")))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "second, longer", string(b))

	boom := errors.New("boom")
	err = Write(path, func(w io.Writer) error {
		io.WriteString(w, "half")
		return boom
	})
	require.ErrorIs(t, err, boom)
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "second, longer", string(b), "a failed write leaves the old file")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary file is left behind")

	require.Error(t, Write(filepath.Join(dir, "missing", "x"), put("x")))
}

// TestRemoveStale: the temporary files of writes killed midway are removed, nothing
// else is (the file itself, another file's temporaries).
func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.snap")
	for _, name := range []string{"state.snap", "state.snap.tmp-123", "state.snap.tmp-9", "other.snap.tmp-1", "state.snapx"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600))
	}
	n, err := RemoveStale(path)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	require.Equal(t, []string{"other.snap.tmp-1", "state.snap", "state.snapx"}, left)
}

// TestWriteIsPrivate: the file Write leaves is readable by its owner only (a snapshot
// carries the engine's prefix-chain key), whatever the umask, and replacing a file
// keeps it so.
func TestWriteIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.snap")
	for range 2 {
		require.NoError(t, Write(path, func(w io.Writer) error { _, err := io.WriteString(w, "key"); return err }))
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	}
}
