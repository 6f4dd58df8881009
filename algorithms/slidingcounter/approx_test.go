package slidingcounter_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/storetest"
)

// A pattern is recorded traffic on one key: request times in
// microseconds from T0, ascending, each of cost 1.
type pattern struct {
	name  string
	times func(r *rand.Rand, lim, w, windows int64) []int64
}

// poisson is arrivals at rate perWindow a window, for windows windows.
func poisson(r *rand.Rand, perWindow float64, w, windows int64) []int64 {
	var ts []int64
	for t := 0.0; ; {
		t += r.ExpFloat64() * float64(w) / perWindow
		if int64(t) >= windows*w {
			return ts
		}
		ts = append(ts, int64(t))
	}
}

var patterns = []pattern{
	{"below the limit: Poisson at L/2", func(r *rand.Rand, lim, w, windows int64) []int64 {
		return poisson(r, float64(lim)/2, w, windows)
	}},
	{"steady at the limit, evenly spaced", func(r *rand.Rand, lim, w, windows int64) []int64 {
		phase := r.Int64N(w / lim)
		var ts []int64
		for t := phase; t < windows*w; t += w / lim {
			ts = append(ts, t)
		}
		return ts
	}},
	{"steady at the limit, Poisson", func(r *rand.Rand, lim, w, windows int64) []int64 {
		return poisson(r, float64(lim), w, windows)
	}},
	{"bursty: bursts of L/5 in 2% of W, on average L a window", func(r *rand.Rand, lim, w, windows int64) []int64 {
		var ts []int64
		size := max(lim/5, 1)
		for _, start := range poisson(r, float64(lim)/float64(size), w, windows) {
			for i := range size {
				ts = append(ts, start+i*w/50/size)
			}
		}
		slices.Sort(ts)
		return ts
	}},
	{"just above the limit: Poisson at 1.1 L", func(r *rand.Rand, lim, w, windows int64) []int64 {
		return poisson(r, 1.1*float64(lim), w, windows)
	}},
	{"well above the limit: Poisson at 3 L", func(r *rand.Rand, lim, w, windows int64) []int64 {
		return poisson(r, 3*float64(lim), w, windows)
	}},
}

// comparison is one pattern decided by both algorithms.
type comparison struct {
	requests, logAdmitted, counterAdmitted int
	counterOnly, logOnly                   int // admitted by one and not the other
	// The counter's decisions against the exact rule on the counter's own
	// history: admitted though its last W then held more than L, denied
	// though one more unit would have fitted.
	wrongAdmit, wrongDeny int
	worst                 int // most counter admissions in any window of length W
	worstFixed            int // most counter admissions in one fixed window
	logWorst              int
}

// compare decides the requests ts (cost 1, at T0 + ts) with the counter's
// Go twin and with the exact sliding log's, each on its own state.
func compare(ts []int64, lim, w int64) comparison {
	var c comparison
	var st slidingcounter.State
	var ok bool
	var log slidingwindow.Log
	var counterAt, logAt []int64
	fixed := map[int64]int{}
	lo := 0 // the oldest counter admission inside the last W
	for _, t := range ts {
		now := storetest.T0 + t
		next, admit, _ := slidingcounter.Decide(st, ok, now, lim, w, 1)
		exact := slidingwindow.Decide(&log, now, lim, w, 1)[0] == 1
		c.requests++
		switch {
		case admit && !exact:
			c.counterOnly++
		case exact && !admit:
			c.logOnly++
		}
		if exact {
			c.logAdmitted++
			logAt = append(logAt, now)
		}
		for lo < len(counterAt) && counterAt[lo] <= now-w {
			lo++
		}
		held := len(counterAt) - lo
		switch {
		case admit && held+1 > int(lim):
			c.wrongAdmit++
		case !admit && held+1 <= int(lim):
			c.wrongDeny++
		}
		if admit {
			st, ok = next, true
			c.counterAdmitted++
			counterAt = append(counterAt, now)
			fixed[now/w]++
			c.worstFixed = max(c.worstFixed, fixed[now/w])
		}
	}
	c.worst = storetest.WindowMax(counterAt, w)
	c.logWorst = storetest.WindowMax(logAt, w)
	return c
}

// TestApproximation measures the counter against the exact sliding log on
// the same recorded traffic (seeded, so the figures are the same on every
// run) and checks that docs/slidingcounter.md holds the table it prints:
//
//	go test -run TestApproximation -v ./algorithms/slidingcounter
//
// Whatever the traffic, no fixed window admits more than the limit and the
// log never admits more than the limit in any window.
func TestApproximation(t *testing.T) {
	const w, windows = 1_000_000, 600
	var b strings.Builder
	b.WriteString("| L | traffic | requests | admitted: log | admitted: counter | decided differently | counter only / log only | wrongly admitted / denied on its own history | most in any W: counter |\n")
	b.WriteString("| --: | --- | --: | --: | --: | --: | --: | --: | --: |\n")
	for _, lim := range []int64{100, 10} {
		for i, pt := range patterns {
			r := rand.New(rand.NewPCG(uint64(lim), uint64(i)))
			c := compare(pt.times(r, lim, w, windows), lim, w)
			if c.worstFixed > int(lim) || c.logWorst > int(lim) {
				t.Errorf("%d %s: %d in one fixed window, log %d in one window: limit %d", lim, pt.name, c.worstFixed, c.logWorst, lim)
			}
			fmt.Fprintf(&b, "| %d | %s | %d | %d | %d | %s | %d / %d | %s / %s | %d (%s) |\n",
				lim, pt.name, c.requests, c.logAdmitted, c.counterAdmitted,
				percent(c.counterOnly+c.logOnly, c.requests), c.counterOnly, c.logOnly,
				percent(c.wrongAdmit, c.requests), percent(c.wrongDeny, c.requests),
				c.worst, signed(c.worst-int(lim), lim))
		}
	}
	table := b.String()
	t.Logf("%d windows of 1 s each:\n%s", windows, table)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "slidingcounter.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), table) {
		t.Errorf("docs/slidingcounter.md does not hold this table: paste it there (go test -run TestApproximation -v ./algorithms/slidingcounter)")
	}
}

// signed is d as a share of lim, with its sign.
func signed(d int, lim int64) string {
	return fmt.Sprintf("%+.0f%%", 100*float64(d)/float64(lim))
}

func percent(n, of int) string {
	if of == 0 {
		return "0%"
	}
	p := 100 * float64(n) / float64(of)
	if p != 0 && p < 0.01 {
		return "<0.01%"
	}
	return fmt.Sprintf("%.2f%%", math.Round(p*100)/100)
}
