package fallback

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxSlots bounds the instances that can share one state dir without IDs
// of their own.
const maxSlots = 256

// claimState makes the state dir this process's: with an ID, it locks the
// ID's lock file, so two live processes never share one journal; without
// one, it claims the first free slot of the dir and takes the ID stored in
// it (written the first time: the hostname, the slot number and 32 random
// bits, unique across dirs), so an
// instance restarted on the same dir — SIGTERM or SIGKILL, in a new
// container with a new hostname — finds its journal again under the same
// ID. A lock is released when the process ends, however it ends. It
// returns the ID and the lock to close at Close.
func claimState(dir, id string) (string, *os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("fallback: state dir: %w", err)
	}
	if id != "" {
		f, err := lockFile(filepath.Join(dir, "holdfast-"+id+".lock"))
		if errors.Is(err, errLocked) {
			return "", nil, fmt.Errorf("fallback: state dir %s is in use by another live instance with ID %q: give each instance its own ID or state dir", dir, id)
		}
		return id, f, err
	}
	for n := 1; n <= maxSlots; n++ {
		f, err := lockFile(filepath.Join(dir, "holdfast-slot-"+strconv.Itoa(n)+".lock"))
		if errors.Is(err, errLocked) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		stored, err := readSlotID(f)
		if err != nil {
			f.Close()
			return "", nil, err
		}
		if stored == "" {
			// Unique across dirs too: instances of one host with a dir
			// each all claim slot 1, and the ID names them in the
			// membership set.
			host, _ := os.Hostname()
			if host == "" {
				host = "holdfast"
			}
			var r [4]byte
			rand.Read(r[:])
			stored = host + "-" + strconv.Itoa(n) + "-" + hex.EncodeToString(r[:])
			if err := writeSlotID(f, stored); err != nil {
				f.Close()
				return "", nil, err
			}
		}
		return stored, f, nil
	}
	return "", nil, fmt.Errorf("fallback: state dir %s: all %d instance slots are held by live instances", dir, maxSlots)
}

var errLocked = errors.New("locked by another process")

// readSlotID reads the ID a slot file holds ("" for a new slot).
func readSlotID(f *os.File) (string, error) {
	b := make([]byte, 512)
	n, err := f.ReadAt(b, 0)
	if err != nil && n == 0 && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("fallback: state dir slot %s: %w", f.Name(), err)
	}
	id := strings.TrimSpace(string(b[:n]))
	for _, c := range id {
		if c <= ' ' || c == '{' || c == '}' || c == '/' {
			return "", fmt.Errorf("fallback: state dir slot %s holds a malformed ID %q", f.Name(), id)
		}
	}
	return id, nil
}

func writeSlotID(f *os.File, id string) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(id+"\n"), 0); err != nil {
		return err
	}
	return f.Sync()
}
