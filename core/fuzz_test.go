package core_test

import (
	"errors"
	"testing"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// FuzzParseReply: any five-or-other integers either parse into a Reply that
// says what they said, or fail with ErrMalformedReply; nothing panics.
func FuzzParseReply(f *testing.F) {
	f.Add(int64(1), int64(3), int64(0), int64(900), int64(1_767_225_600_000_000), 5)
	f.Add(int64(0), int64(0), int64(200_000), int64(1_000_000), int64(1), 5)
	f.Add(int64(2), int64(-1), int64(-5), int64(0), int64(0), 4)
	f.Fuzz(func(t *testing.T, a, b, c, d, e int64, n int) {
		raw := []int64{a, b, c, d, e}
		if n >= 0 && n < len(raw) {
			raw = raw[:n]
		}
		r, err := driver.ParseReply(raw)
		if err != nil {
			if !errors.Is(err, core.ErrMalformedReply) {
				t.Fatalf("error %v is not ErrMalformedReply", err)
			}
			return
		}
		if r.Allowed != (a == 1) || r.Remaining != b || r.RetryAfter != c || r.ResetAfter != d || r.Now != e {
			t.Fatalf("ParseReply(%v) = %+v", raw, r)
		}
		if c < 0 || d < 0 || e <= 0 {
			t.Fatalf("accepted a negative duration or clock: %v", raw)
		}
	})
}
