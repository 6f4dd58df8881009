// Package redact keeps credentials out of error messages.
package redact

import (
	"errors"
	"strings"
)

// Mask replaces the user-info of a URL ("user:password") wherever it
// appears.
const Mask = "REDACTED"

// URLError returns err with every occurrence of rawURL's user-info (and of
// its password alone) replaced by Mask, so a URL error can be logged. The
// result does not wrap err: the wrapped error would still carry the secret.
func URLError(rawURL string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if info := userInfo(rawURL); info != "" {
		msg = strings.ReplaceAll(msg, info, Mask)
		if _, pw, ok := strings.Cut(info, ":"); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, Mask)
		}
	}
	return errors.New(msg)
}

// userInfo is the part between "://" and the last "@" before the path.
func userInfo(rawURL string) string {
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	i := strings.LastIndexByte(rest, '@')
	if i < 0 {
		return ""
	}
	return rest[:i]
}
