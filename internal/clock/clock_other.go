//go:build !(linux && amd64)

package clock

import "time"

// WallMicros reads the wall clock in microseconds since the Unix epoch.
func WallMicros() int64 { return time.Now().UnixMicro() }
