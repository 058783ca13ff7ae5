package guard

import "os"

func writeFileMode(path, body string, mode uint32) error {
	if err := os.WriteFile(path, []byte(body), os.FileMode(mode)); err != nil {
		return err
	}
	return os.Chmod(path, os.FileMode(mode))
}
