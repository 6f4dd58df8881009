package tokenbucket_test

import (
	"strings"
	"testing"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
)

// TestScriptsInline: the decision script, its Many and its Keys hold the
// bucket's reading, write and tokens left in line (read.lua, write.lua,
// remaining.lua) once each, with
// no marker left.
func TestScriptsInline(t *testing.T) {
	sc := tokenbucket.Algorithm.Script()
	m := sc.Many()
	for _, s := range []struct{ name, src string }{{"decision", sc.Source()}, {"many", m.Script.Source()}, {"keys", m.Keys.Source()}} {
		if strings.Contains(s.src, "-- #read") || strings.Contains(s.src, "-- #write") || strings.Contains(s.src, "-- #remaining") {
			t.Errorf("%s: a marker left in its source", s.name)
		}
		for _, part := range []string{"redis.pcall('GET', key)", "'KEEPTTL')", "local remaining = 0"} {
			if n := strings.Count(s.src, part); n != 1 {
				t.Errorf("%s: %q %d times, want once", s.name, part, n)
			}
		}
	}
}
