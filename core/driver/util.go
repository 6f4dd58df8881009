package driver

import "fmt"

// errorf wraps sentinel with a formatted detail: "sentinel: detail".
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// Errorf wraps sentinel with a formatted detail, for packages that report
// core's errors with their own context.
func Errorf(sentinel error, format string, args ...any) error {
	return errorf(sentinel, format, args...)
}
