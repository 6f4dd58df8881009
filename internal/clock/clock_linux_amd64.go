package clock

import (
	"syscall"
	"time"
)

// WallMicros reads the wall clock in microseconds since the Unix epoch.
// On linux/amd64 gettimeofday is one vDSO call; time.Now reads the wall
// and the monotonic clocks, twice the cost.
func WallMicros() int64 {
	var tv syscall.Timeval
	if err := syscall.Gettimeofday(&tv); err != nil {
		return time.Now().UnixMicro()
	}
	return tv.Sec*1_000_000 + tv.Usec
}
