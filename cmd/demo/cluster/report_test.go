package cluster

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/fallback"
)

// fakeRecord is a 12-second run with Redis down from 4s to 8s: heavy
// clients at their allowance, gentle clients at 2/s, all instances closed
// at the end.
func fakeRecord() *Record {
	const secs = 12
	r := &Record{Backend: "goredis", Duration: secs * time.Second, Routes: demoRoutes(),
		Instances: []string{"app1", "app2"}, KillAt: 4 * time.Second, RestartAt: 8 * time.Second,
		ReconciledAt: 8300 * time.Millisecond, RecoveredAt: 9500 * time.Millisecond}
	series := func(route, client string, heavy bool, adm, rej func(s int) int) *Series {
		s := &Series{Route: route, Client: client, Heavy: heavy, Rate: 2}
		if heavy {
			s.Rate = 50
		}
		for i := range secs {
			s.Admitted = append(s.Admitted, adm(i))
			s.Rejected = append(s.Rejected, rej(i))
			s.Errors, s.ServerErrors, s.Local = append(s.Errors, 0), append(s.ServerErrors, 0), append(s.Local, 0)
		}
		return s
	}
	tbHeavy := func(s int) int {
		if s == 0 {
			return 25
		}
		return 5
	}
	swHeavy := func(s int) int { return 20 * ((s + 1) % 2) }
	two := func(int) int { return 2 }
	zero := func(int) int { return 0 }
	r.Series = []*Series{
		series("tb", "heavy", true, tbHeavy, func(s int) int { return 50 - tbHeavy(s) }),
		series("tb", "gentle", false, two, zero),
		series("sw", "heavy", true, swHeavy, func(s int) int { return 50 - swHeavy(s) }),
		series("sw", "gentle", false, two, zero),
	}
	for s := range secs {
		state := "closed"
		if s >= 4 && s < 8 {
			state = "open"
		}
		r.Breakers = append(r.Breakers, []string{state, state})
		r.Pending = append(r.Pending, 0)
		r.RedisDown = append(r.RedisDown, s >= 4 && s < 8)
	}
	for _, id := range r.Instances {
		r.Final = append(r.Final, serve.Status{Status: fallback.Status{ID: id, Breaker: "closed"}})
	}
	return r
}

// svgElem is any element of the chart, with the attributes the test reads.
type svgElem struct {
	XMLName xml.Name
	Class   string     `xml:"class,attr"`
	Series  string     `xml:"data-series,attr"`
	Points  string     `xml:"points,attr"`
	X       string     `xml:"x,attr"`
	Width   string     `xml:"width,attr"`
	Kids    []svgElem  `xml:",any"`
	Attrs   []xml.Attr `xml:",any,attr"`
}

func (e svgElem) walk(f func(svgElem)) {
	f(e)
	for _, k := range e.Kids {
		k.walk(f)
	}
}

func TestWriteReport(t *testing.T) {
	r := fakeRecord()
	dir := t.TempDir()
	checks := Checks(r)
	if err := WriteReport(dir, r, checks); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, SVGFile))
	if err != nil {
		t.Fatal(err)
	}
	var root svgElem
	if err := xml.Unmarshal(raw, &root); err != nil {
		t.Fatalf("the SVG is not well-formed XML: %v", err)
	}
	byClass := map[string][]svgElem{}
	root.walk(func(e svgElem) {
		if e.Class != "" {
			byClass[e.XMLName.Local+"."+e.Class] = append(byClass[e.XMLName.Local+"."+e.Class], e)
		}
	})
	admitted := byClass["polyline.admitted"]
	var names []string
	for _, p := range admitted {
		names = append(names, p.Series)
		if n := len(strings.Fields(p.Points)); n != 12 {
			t.Errorf("series %s has %d points, want one per second (12)", p.Series, n)
		}
	}
	if !slices.Equal(names, []string{"tb heavy", "sw heavy"}) {
		t.Errorf("admitted polylines %v, want one per heavy client: [tb heavy sw heavy]", names)
	}
	// The sw heavy series holds the counts: 20, 0, 20, ... at the top of the
	// panel and at its baseline.
	if ys := yValues(t, admitted[1].Points); ys[0] >= ys[1] || ys[0] != ys[2] {
		t.Errorf("sw heavy y coordinates %v: want a zigzag starting high", ys[:3])
	}
	if n := len(byClass["polyline.cumulative"]); n != 2 {
		t.Errorf("%d cumulative polylines, want 2", n)
	}
	if n := len(byClass["polyline.bound"]); n != 2 {
		t.Errorf("%d bound polylines, want 2", n)
	}
	outage := byClass["rect.outage"]
	if len(outage) != 2 { // one per panel
		t.Fatalf("%d outage rects, want 2", len(outage))
	}
	// 4s..8s of 12s over the plot's 720 units starting at 70.
	if outage[0].X != "310.0" || outage[0].Width != "240.0" {
		t.Errorf("outage rect x=%s width=%s, want 310.0 and 240.0", outage[0].X, outage[0].Width)
	}
	if len(byClass["line.reconciled"]) != 2 || len(byClass["rect.recovering"]) != 2 {
		t.Errorf("reconciled lines %d, recovering rects %d, want 2 each", len(byClass["line.reconciled"]), len(byClass["rect.recovering"]))
	}

	page, _ := os.ReadFile(filepath.Join(dir, HTMLFile))
	for _, want := range []string{"<svg", `class="outage"`, "<table>", "tb heavy within bound held", `<tr class="down">`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
	if n := strings.Count(string(page), "<tr"); n != 12+2 {
		t.Errorf("report.html table has %d rows, want a header, 12 seconds and the totals", n)
	}
	md, _ := os.ReadFile(filepath.Join(dir, MarkdownFile))
	lines := strings.Split(string(md), "\n")
	if lines[0] != "| sec | redis | tb heavy | tb gentle | sw heavy | sw gentle | local | breakers | pending |" {
		t.Errorf("markdown header %q", lines[0])
	}
	if lines[6] != "| 5 | DOWN | 5/45/0 | 2/0/0 | 20/30/0 | 2/0/0 | 0 | OO | 0 |" {
		t.Errorf("markdown second 5: %q", lines[6])
	}
	if lines[14] != "| all |  | 80/520/0 | 24/0/0 | 120/480/0 | 24/0/0 | 0 |  |  |" {
		t.Errorf("markdown totals: %q", lines[14])
	}
}

func yValues(t *testing.T, points string) []float64 {
	t.Helper()
	var ys []float64
	for _, p := range strings.Fields(points) {
		_, y, _ := strings.Cut(p, ",")
		v, err := strconv.ParseFloat(y, 64)
		if err != nil {
			t.Fatal(err)
		}
		ys = append(ys, v)
	}
	return ys
}

func TestChecks(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(r *Record)
		broken []string
	}{
		{"all held", func(*Record) {}, nil},
		{"heavy above the bound", func(r *Record) { r.Series[0].Admitted[3] += 10 }, []string{"tb heavy within bound"}},
		{"heavy far below the bound", func(r *Record) { r.Series[2].Admitted[0] = 0; r.Series[2].Admitted[2] = 0 }, []string{"sw heavy within bound"}},
		{"gentle rejected", func(r *Record) { r.Series[3].Rejected[5] = 1 }, []string{"sw gentle never rejected"}},
		{"a 5xx", func(r *Record) { r.Series[1].Errors[2], r.Series[1].ServerErrors[2] = 1, 1 }, []string{"no errors"}},
		{"breaker still open", func(r *Record) { r.Final[1].Breaker = "open" }, []string{"instances recovered"}},
		{"log not drained", func(r *Record) { r.Final[0].PendingLog = 3 }, []string{"instances recovered"}},
		{"instance silent", func(r *Record) { r.Final = r.Final[:1] }, []string{"instances recovered"}},
	}
	for _, tt := range tests {
		r := fakeRecord()
		tt.edit(r)
		if got := Broken(Checks(r)); !slices.Equal(got, tt.broken) {
			t.Errorf("%s: broken %v, want %v", tt.name, got, tt.broken)
		}
	}
	// The bound: token bucket 20 + 5/s × 12s = 80; sliding window 20 × (6 + 1).
	r := fakeRecord()
	if b := r.Routes[0].Bound(r.Duration); b != 80 {
		t.Errorf("tb bound %v, want 80", b)
	}
	if b := r.Routes[1].Bound(r.Duration); b != 140 {
		t.Errorf("sw bound %v, want 140", b)
	}
	if b := r.Routes[1].Ideal(r.Duration); b != 120 {
		t.Errorf("sw ideal %v, want 120", b)
	}
	if b := r.Routes[1].Ideal(r.Duration + time.Millisecond); b != 140 {
		t.Errorf("sw ideal over 12.001s %v, want 140", b)
	}
	if s := Checks(r)[0].String(); s != "ok   tb heavy within bound: admitted 80 = 1.000 of the bound 80 (token bucket 20 + 5/s over 12s), want <= 1.05; 1.000 of the 80 one exact limiter admits, want >= 0.85" {
		t.Errorf("check line %q", s)
	}
}

func TestNginxConf(t *testing.T) {
	dir := t.TempDir()
	path, err := writeNginxConf(dir, "127.0.0.1:9000", []string{"127.0.0.1:9001", "127.0.0.1:9002"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for _, want := range []string{"daemon off;", "master_process on;", "pid " + dir + "/nginx.pid;", "error_log " + dir + "/error.log",
		"server 127.0.0.1:9001 max_fails=0;", "server 127.0.0.1:9002 max_fails=0;", "listen 127.0.0.1:9000;",
		"proxy_pass http://holdfast;", "proxy_set_header X-Client-ID $http_x_client_id;"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("nginx.conf lacks %q", want)
		}
	}
	bin, err := findBinary("nginx", "nginx")
	if err != nil {
		t.Fatal(err) // `make test` installs nginx: integration tests are not skipped
	}
	out, err := exec.Command(bin, "-t", "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log")).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
}

func TestFindBinaryNamesThePackage(t *testing.T) {
	_, err := findBinary("holdfast-no-such-server", "holdfast-pkg")
	if err == nil || !strings.Contains(err.Error(), "install the Debian package holdfast-pkg") ||
		!strings.Contains(err.Error(), "not found on PATH or in /usr/sbin") {
		t.Errorf("error %v", err)
	}
	if p, err := findBinary("nginx", "nginx"); err != nil || !strings.HasSuffix(p, "/nginx") {
		t.Errorf("nginx: %q %v", p, err)
	}
}
