// Package atomicfile replaces a file so that a crash leaves either the old content or
// the new, never a torn mix: the engine's snapshot files and the fabric replica's
// snapshots are written through it, and RemoveStale clears what a killed writer left. Any goroutine may call it;
// two writers of one path race as two renames do (the last one wins).
package atomicfile

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with what write produces: it writes to a temporary file in the
// same directory (through a 64 KiB buffer), syncs it, renames it over path and syncs
// the directory, so that the rename itself survives a crash. If write or any step fails,
// the temporary file is removed, path is untouched and the error is returned.
func Write(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<16)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// tempPattern is the name of Write's temporary files for path (os.CreateTemp's
// pattern: the star becomes random digits).
func tempPattern(path string) string { return filepath.Base(path) + ".tmp-*" }

// RemoveStale removes the temporary files a Write of path left behind when its process
// was killed mid-write, and returns how many it removed. Call it before any Write of
// path starts (a writer's own temporary file matches too).
func RemoveStale(path string) (int, error) {
	stale, err := filepath.Glob(filepath.Join(filepath.Dir(path), tempPattern(path)))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range stale {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// syncDir makes a rename in dir durable. A directory that cannot be opened for syncing
// (some platforms and file systems refuse) is not an error: the rename has happened.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !os.IsPermission(err) {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
