package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// Slack on the bound, from DESIGN.md and README ("Known slack"): over a run
// with an outage the heavy clients together get at most 5% more than one
// exact limiter would grant, and at least 85% (reconciliation's replay is
// conservative: it may under-admit about one bucket per outage).
const (
	MaxRatio = 1.05
	MinRatio = 0.85
)

// A Check is one invariant's verdict, printed as one line of the summary.
type Check struct {
	// Name is the invariant, e.g. "tb heavy within bound".
	Name string
	// OK reports whether it held.
	OK bool
	// Detail is the measurement behind the verdict.
	Detail string
}

// String returns "ok   NAME: DETAIL" or "FAIL NAME: DETAIL".
func (c Check) String() string {
	v := "ok  "
	if !c.OK {
		v = "FAIL"
	}
	return v + " " + c.Name + ": " + c.Detail
}

// Checks evaluates the invariants of DESIGN.md on a run:
//   - each heavy client's admitted total is at most MaxRatio × its route's
//     bound over the run (Route.Bound) and at least MinRatio × what one
//     exact limiter would have admitted it (Route.Ideal);
//   - gentle clients are never rejected;
//   - no request failed (no 5xx, no transport error);
//   - at the end every instance's breaker is closed and its outage log empty.
func Checks(r *Record) []Check {
	var out []Check
	for _, s := range r.Series {
		rt, _ := r.Route(s.Route)
		adm := Total(s.Admitted)
		if s.Heavy {
			b, ideal := rt.Bound(r.Duration), rt.Ideal(r.Duration)
			ratio, got := float64(adm)/b, float64(adm)/ideal
			out = append(out, Check{
				Name: s.Name() + " within bound",
				OK:   ratio <= MaxRatio && got >= MinRatio,
				Detail: fmt.Sprintf("admitted %d = %.3f of the bound %.0f (%s over %v), want <= %.2f; %.3f of the %.0f one exact limiter admits, want >= %.2f",
					adm, ratio, b, rt.Describe(), r.Duration, MaxRatio, got, ideal, MinRatio),
			})
			continue
		}
		rej := Total(s.Rejected)
		out = append(out, Check{
			Name:   s.Name() + " never rejected",
			OK:     rej == 0,
			Detail: fmt.Sprintf("admitted %d, rejected %d", adm, rej),
		})
	}
	errs, fives := 0, 0
	for _, s := range r.Series {
		errs += Total(s.Errors)
		fives += Total(s.ServerErrors)
	}
	out = append(out, Check{Name: "no errors", OK: errs == 0, Detail: fmt.Sprintf("errors %d, of which 5xx %d", errs, fives)})
	var ends []string
	ok := len(r.Final) == len(r.Instances)
	for _, st := range r.Final {
		ends = append(ends, st.ID+" "+st.Breaker+" pending_log "+strconv.Itoa(st.PendingLog))
		ok = ok && st.Breaker == "closed" && st.PendingLog == 0
	}
	if len(ends) < len(r.Instances) {
		ends = append(ends, fmt.Sprintf("%d of %d instances answered /status", len(r.Final), len(r.Instances)))
	}
	out = append(out, Check{Name: "instances recovered", OK: ok, Detail: strings.Join(ends, ", ")})
	return out
}

// Broken returns the names of the checks that failed.
func Broken(cs []Check) []string {
	var out []string
	for _, c := range cs {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

func itoa(n int64) string   { return strconv.FormatInt(n, 10) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', 4, 64) }
