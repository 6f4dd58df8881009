package cluster

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report file names in the output directory.
const (
	SVGFile      = "report.svg"
	HTMLFile     = "report.html"
	MarkdownFile = "table.md"
	TextFile     = "table.txt"
)

// WriteReport writes the chart (SVG), an HTML page embedding it with the
// checks and the table, and the table as Markdown and as text, into dir.
func WriteReport(dir string, r *Record, checks []Check) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var svg strings.Builder
	r.WriteSVG(&svg)
	var page, md, txt strings.Builder
	r.writeHTML(&page, svg.String(), checks)
	r.WriteMarkdown(&md)
	r.WriteTable(&txt)
	for name, body := range map[string]string{SVGFile: svg.String(), HTMLFile: page.String(), MarkdownFile: md.String(), TextFile: txt.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 1100, 650
	plotX, plotW   = 70, 720
	top1, height1  = 80, 230  // admitted per second
	top2, height2  = 385, 220 // cumulative admitted against the bound
)

// colors gives each heavy series its color, in order.
var colors = []string{"#1f77b4", "#e6550d", "#2ca02c", "#9467bd"}

// chart maps run time and values to one panel's coordinates.
type chart struct {
	w          io.Writer
	secs, ymax float64
	top, h     float64
}

func (c *chart) x(t float64) float64 { return plotX + t/c.secs*plotW }
func (c *chart) y(v float64) float64 { return c.top + c.h - v/c.ymax*c.h }

// polyline writes one series of (t, v) points.
func (c *chart) polyline(class, series, color, dash string, ts, vs []float64) {
	var pts strings.Builder
	for i := range ts {
		fmt.Fprintf(&pts, "%.1f,%.1f ", c.x(ts[i]), c.y(vs[i]))
	}
	if dash != "" {
		dash = ` stroke-dasharray="` + dash + `"`
	}
	fmt.Fprintf(c.w, `<polyline class="%s" data-series="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n",
		class, html.EscapeString(series), color, dash, strings.TrimSpace(pts.String()))
}

// frame writes the panel's axes, grid, title and the outage marks.
func (c *chart) frame(r *Record, title, ylabel string) {
	fmt.Fprintf(c.w, `<text x="%d" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", plotX, c.top-12, html.EscapeString(title))
	r.outageMarks(c)
	step := niceStep(c.ymax / 5)
	for v := 0.0; v <= c.ymax+1e-9; v += step {
		fmt.Fprintf(c.w, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", plotX, plotX+plotW, c.y(v), c.y(v))
		fmt.Fprintf(c.w, `<text x="%d" y="%.1f" font-size="11" text-anchor="end">%g</text>`+"\n", plotX-6, c.y(v)+4, v)
	}
	xstep := niceStep(c.secs / 10)
	for t := 0.0; t <= c.secs+1e-9; t += xstep {
		fmt.Fprintf(c.w, `<text x="%.1f" y="%.0f" font-size="11" text-anchor="middle">%gs</text>`+"\n", c.x(t), c.top+c.h+16, t)
	}
	fmt.Fprintf(c.w, `<rect x="%d" y="%.0f" width="%d" height="%.0f" fill="none" stroke="#444"/>`+"\n", plotX, c.top, plotW, c.h)
	fmt.Fprintf(c.w, `<text transform="translate(%d,%.0f) rotate(-90)" font-size="12" text-anchor="middle">%s</text>`+"\n",
		plotX-45, c.top+c.h/2, html.EscapeString(ylabel))
}

// outageMarks shades the outage and the recovery and marks the first
// reconciliation.
func (r *Record) outageMarks(c *chart) {
	end := r.Duration.Seconds()
	kill, restart := sec(r.KillAt), sec(r.RestartAt)
	if r.KillAt >= 0 {
		if r.RestartAt < 0 {
			restart = end
		}
		fmt.Fprintf(c.w, `<rect class="outage" x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#f9d6d5" stroke="none"/>`+"\n",
			c.x(kill), c.top, c.x(restart)-c.x(kill), c.h)
		down := r.fault().label
		if r.Cluster != nil {
			down = "tb heavy's master down (SIGKILL)"
		}
		fmt.Fprintf(c.w, `<text x="%.1f" y="%.0f" font-size="11" fill="#a00">%s</text>`+"\n", c.x(kill)+4, c.top+14, html.EscapeString(down))
	}
	if r.RestartAt >= 0 && r.RecoveredAt > r.RestartAt {
		fmt.Fprintf(c.w, `<rect class="recovering" x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#fcf0c0" stroke="none"/>`+"\n",
			c.x(restart), c.top, c.x(sec(r.RecoveredAt))-c.x(restart), c.h)
	}
	if r.ReconciledAt >= 0 {
		x := c.x(sec(r.ReconciledAt))
		fmt.Fprintf(c.w, `<line class="reconciled" x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#2ca02c" stroke-width="2" stroke-dasharray="6 3"/>`+"\n",
			x, x, c.top, c.top+c.h)
		fmt.Fprintf(c.w, `<text x="%.1f" y="%.0f" font-size="11" fill="#1a7a1a">reconciled %.1fs</text>`+"\n", x+4, c.top+28, sec(r.ReconciledAt))
	}
}

// WriteSVG writes the chart: the heavy clients' admitted per second against
// each policy's allowance (one polyline of class "admitted" per heavy
// client), and their cumulative admitted against the bound (class
// "cumulative" and "bound"); the outage is the rect of class "outage", the
// first reconciliation the line of class "reconciled".
func (r *Record) WriteSVG(w io.Writer) {
	secs := math.Max(r.Duration.Seconds(), 1)
	heavy := r.Heavy()
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	what := "Redis is"
	if r.Cluster != nil {
		what = "one Redis Cluster master is"
	}
	fmt.Fprintf(w, `<text x="%d" y="24" font-size="16" font-weight="bold">holdfast: %d instances behind nginx share one limit while %s %s (%s)</text>`+"\n",
		plotX, len(r.Instances), what, html.EscapeString(r.fault().title), html.EscapeString(r.Backend))
	r.perSecondPanel(w, secs, heavy)
	r.cumulativePanel(w, secs, heavy)
	r.legend(w, heavy)
	fmt.Fprintln(w, "</svg>")
}

// perSecondPanel plots each heavy client's admitted per second and its
// policy's allowance.
func (r *Record) perSecondPanel(w io.Writer, secs float64, heavy []*Series) {
	ymax := 1.0
	for _, s := range heavy {
		for _, v := range s.Admitted {
			ymax = math.Max(ymax, float64(v))
		}
		rt, _ := r.Route(s.Route)
		ymax = math.Max(ymax, rt.Allowance())
	}
	c1 := &chart{w: w, secs: secs, ymax: niceCeil(ymax * 1.1), top: top1, h: height1}
	c1.frame(r, "admitted per second, heavy clients (through nginx), against the policy's allowance", "admitted / s")
	for i, s := range heavy {
		color := colors[i%len(colors)]
		rt, _ := r.Route(s.Route)
		ts, vs := make([]float64, len(s.Admitted)), make([]float64, len(s.Admitted))
		for k, v := range s.Admitted {
			ts[k], vs[k] = math.Min(float64(k)+0.5, secs), float64(v)
		}
		c1.polyline("allowance", s.Route, color, "3 4", []float64{0, secs}, []float64{rt.Allowance(), rt.Allowance()})
		c1.polyline("admitted", s.Name(), color, "", ts, vs)
	}
}

// cumulativePanel plots each heavy client's admitted so far against the
// bound at each instant.
func (r *Record) cumulativePanel(w io.Writer, secs float64, heavy []*Series) {
	ymax := 1.0
	for _, s := range heavy {
		rt, _ := r.Route(s.Route)
		ymax = math.Max(ymax, math.Max(rt.Bound(r.Duration), float64(Total(s.Admitted))))
	}
	c2 := &chart{w: w, secs: secs, ymax: niceCeil(ymax * 1.05), top: top2, h: height2}
	c2.frame(r, "cumulative admitted, heavy clients, against the bound of one exact limiter", "admitted")
	for i, s := range heavy {
		color := colors[i%len(colors)]
		rt, _ := r.Route(s.Route)
		var bt, bv []float64
		for t := 0.0; t <= secs+1e-9; t += 0.05 {
			bt, bv = append(bt, t), append(bv, rt.Bound(time.Duration(t*float64(time.Second))))
		}
		c2.polyline("bound", s.Route+" bound", color, "3 4", bt, bv)
		ts, vs := []float64{0}, []float64{0}
		sum := 0
		for k, v := range s.Admitted {
			sum += v
			ts, vs = append(ts, math.Min(float64(k+1), secs)), append(vs, float64(sum))
		}
		c2.polyline("cumulative", s.Name(), color, "", ts, vs)
	}
}

// legend writes the series' key to the right of the plots.
func (r *Record) legend(w io.Writer, heavy []*Series) {
	x, y := plotX+plotW+20, top1+10
	entry := func(color, dash, label string) {
		if dash != "" {
			dash = ` stroke-dasharray="` + dash + `"`
		}
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", x, x+24, y, y, color, dash)
		fmt.Fprintf(w, `<text x="%d" y="%d" font-size="12">%s</text>`+"\n", x+30, y+4, html.EscapeString(label))
		y += 20
	}
	for i, s := range heavy {
		rt, _ := r.Route(s.Route)
		color := colors[i%len(colors)]
		entry(color, "", fmt.Sprintf("%s (%g req/s)", s.Name(), s.Rate))
		entry(color, "3 4", fmt.Sprintf("%s: %s", rt.Name, rt.Describe()))
	}
	y += 10
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="24" height="12" fill="#f9d6d5"/><text x="%d" y="%d" font-size="12">Redis down</text>`+"\n", x, y-6, x+30, y+4)
	y += 20
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="24" height="12" fill="#fcf0c0"/><text x="%d" y="%d" font-size="12">until all breakers closed</text>`+"\n", x, y-6, x+30, y+4)
	y += 20
	entry("#2ca02c", "6 3", "first reconciliation")
}

func sec(d time.Duration) float64 { return d.Seconds() }

// niceStep returns 1, 2 or 5 times a power of ten, at least x.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds x up to a multiple of its nice step.
func niceCeil(x float64) float64 {
	s := niceStep(x / 5)
	return math.Ceil(x/s) * s
}

// writeHTML writes the report page: the run, the checks, the chart and the
// table.
func (r *Record) writeHTML(w io.Writer, svg string, checks []Check) {
	fmt.Fprintf(w, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>holdfast demo report</title>
<style>
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-family: monospace; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
tr.down td { background: #fbe3e3; }
.ok { color: #1a7a1a; } .fail { color: #b00; font-weight: bold; }
.legend { color: #555; font-size: 13px; }
</style></head><body>
<h1>holdfast demo report</h1>
<p>%d instances (%s backend) behind nginx; load for %v; Redis %s at %.1fs, %s at %.1fs.</p>
<h2>Invariants</h2>
<ul>
`, len(r.Instances), html.EscapeString(r.Backend), r.Duration, html.EscapeString(r.fault().on), sec(r.KillAt), html.EscapeString(r.fault().off), sec(r.RestartAt))
	for _, c := range checks {
		class, verdict := "ok", "held"
		if !c.OK {
			class, verdict = "fail", "BROKEN"
		}
		fmt.Fprintf(w, "<li class=\"%s\">%s %s: %s</li>\n", class, html.EscapeString(c.Name), verdict, html.EscapeString(c.Detail))
	}
	fmt.Fprintln(w, "</ul>")
	if lines := r.ClusterSummary(); lines != nil {
		fmt.Fprintf(w, "<h2>Redis Cluster</h2>\n<pre>%s</pre>\n", html.EscapeString(strings.Join(lines, "\n")))
	}
	fmt.Fprintln(w, "<h2>Chart</h2>")
	fmt.Fprintln(w, svg)
	fmt.Fprintln(w, "<h2>Per second</h2>")
	r.writeHTMLTable(w)
	fmt.Fprintln(w, "</body></html>")
}
