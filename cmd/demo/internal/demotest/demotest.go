// Package demotest checks the output of the demo's `cluster` runs in tests,
// from the figures the run prints, not from its own verdicts.
package demotest

import (
	"regexp"
	"strconv"
	"testing"
)

var (
	heavyLine  = regexp.MustCompile(`(?m)^ok   (tb|sw) heavy within bound: admitted (\d+) = ([\d.]+) of the bound (\d+) .*; ([\d.]+) of the (\d+) one exact`)
	gentleLine = regexp.MustCompile(`(?m)^ok   (tb|sw) gentle never rejected: admitted (\d+), rejected 0$`)
)

// CheckShortRun checks the summary of a `cluster` run with phases of 3s,
// 3s and 4s: per route, the heavy client's bound and ideal are the policy's
// over 10s (token bucket 20 + 5/s × 10s; sliding window 20 per 2s, 5
// windows from the start, 6 for the bound), its admitted count lies within
// [0.85 × ideal, 1.05 × bound], and the gentle client (2/s) was admitted
// 20 times and never rejected.
func CheckShortRun(t testing.TB, out string) {
	t.Helper()
	m := heavyLine.FindAllStringSubmatch(out, -1)
	if len(m) != 2 {
		t.Fatalf("want a heavy-client line per route, got %v", m)
	}
	bounds := map[string][2]float64{"tb": {70, 70}, "sw": {120, 100}}
	for _, l := range m {
		adm, _ := strconv.Atoi(l[2])
		b, _ := strconv.ParseFloat(l[4], 64)
		ideal, _ := strconv.ParseFloat(l[6], 64)
		if b != bounds[l[1]][0] || ideal != bounds[l[1]][1] {
			t.Errorf("%s bound %v and ideal %v, want %v", l[1], b, ideal, bounds[l[1]])
		}
		if float64(adm) > 1.05*b || float64(adm) < 0.85*ideal {
			t.Errorf("%s heavy admitted %d: bound %v, ideal %v", l[1], adm, b, ideal)
		}
	}
	g := gentleLine.FindAllStringSubmatch(out, -1)
	if len(g) != 2 {
		t.Errorf("want a gentle-client line per route, got %v", g)
	}
	for _, l := range g {
		if n, _ := strconv.Atoi(l[2]); n != 20 { // 2/s for 10s
			t.Errorf("%s gentle admitted %d, want 20", l[1], n)
		}
	}
}
