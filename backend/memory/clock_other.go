//go:build !(linux && amd64)

package memory

import "time"

// wallMicros reads the wall clock in microseconds since the Unix epoch.
func wallMicros() int64 { return time.Now().UnixMicro() }
