//go:build !unix

package fallback

import (
	"os"
)

// lockFile opens path; without flock, no lock is taken.
func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
