package cluster

import (
	"fmt"
	"html"
	"io"
	"strconv"
	"strings"
)

// stateLetter abbreviates a breaker state for the table: C closed, O open,
// R reconciling, ? no answer.
func stateLetter(s string) string {
	switch s {
	case "closed":
		return "C"
	case "open":
		return "O"
	case "reconciling":
		return "R"
	}
	return "?"
}

// row is one second of the table, as cells.
func (r *Record) row(sec int) []string {
	redis := "up"
	if sec < len(r.RedisDown) && r.RedisDown[sec] {
		redis = "DOWN"
	}
	cells := []string{strconv.Itoa(sec + 1), redis}
	local := 0
	for _, s := range r.Series {
		cells = append(cells, fmt.Sprintf("%d/%d/%d", at(s.Admitted, sec), at(s.Rejected, sec), at(s.Errors, sec)))
		local += at(s.Local, sec)
	}
	var b strings.Builder
	if sec < len(r.Breakers) {
		for _, st := range r.Breakers[sec] {
			b.WriteString(stateLetter(st))
		}
	}
	return append(cells, strconv.Itoa(local), b.String(), strconv.Itoa(at(r.Pending, sec)))
}

// header returns the table's column names.
func (r *Record) header() []string {
	h := []string{"sec", "redis"}
	for _, s := range r.Series {
		h = append(h, s.Name())
	}
	return append(h, "local", "breakers", "pending")
}

// totals returns the table's last row: each series summed.
func (r *Record) totals() []string {
	cells := []string{"all", ""}
	local := 0
	for _, s := range r.Series {
		cells = append(cells, fmt.Sprintf("%d/%d/%d", Total(s.Admitted), Total(s.Rejected), Total(s.Errors)))
		local += Total(s.Local)
	}
	return append(cells, strconv.Itoa(local), "", "")
}

func at(xs []int, i int) int {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// tableLegend explains the table's cells.
const tableLegend = "cells: admitted/rejected/errors that second, counted at the client through nginx; " +
	"local: admissions decided by a lease; breakers: each instance's breaker (C closed, O open, R reconciling); " +
	"pending: outage-log grants not yet in Redis"

// clusterLegend is added to tableLegend for a run on Redis Cluster.
const clusterLegend = "; on Redis Cluster, redis DOWN: the killed master is down (the other masters stay up), " +
	"breakers: each instance's most degraded shard"

// legendText is the table's legend for this run.
func (r *Record) legendText() string {
	if r.Cluster != nil {
		return tableLegend + clusterLegend
	}
	if f := r.fault(); f.name != "kill" {
		return tableLegend + "; " + f.legend
	}
	return tableLegend
}

// WriteTable writes the per-second table as aligned text.
func (r *Record) WriteTable(w io.Writer) {
	rows := [][]string{r.header()}
	for s := range r.Seconds() {
		rows = append(rows, r.row(s))
	}
	rows = append(rows, r.totals())
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			if i == 1 || i == len(row)-2 { // text columns left-aligned
				fmt.Fprintf(&b, "%-*s", width[i], c)
			} else {
				fmt.Fprintf(&b, "%*s", width[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w, r.legendText())
}

// WriteMarkdown writes the per-second table as a Markdown table.
func (r *Record) WriteMarkdown(w io.Writer) {
	line := func(cells []string) { fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |") }
	h := r.header()
	line(h)
	sep := make([]string, len(h))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for s := range r.Seconds() {
		line(r.row(s))
	}
	line(r.totals())
	fmt.Fprintln(w)
	fmt.Fprintln(w, r.legendText()+".")
}

// writeHTMLTable writes the per-second table as an HTML table.
func (r *Record) writeHTMLTable(w io.Writer) {
	fmt.Fprintln(w, "<table>")
	cells := func(tag string, row []string, class string) {
		fmt.Fprintf(w, "<tr%s>", class)
		for _, c := range row {
			fmt.Fprintf(w, "<%s>%s</%s>", tag, html.EscapeString(c), tag)
		}
		fmt.Fprintln(w, "</tr>")
	}
	cells("th", r.header(), "")
	for s := range r.Seconds() {
		class := ""
		if s < len(r.RedisDown) && r.RedisDown[s] {
			class = ` class="down"`
		}
		cells("td", r.row(s), class)
	}
	cells("th", r.totals(), "")
	fmt.Fprintln(w, "</table>")
	fmt.Fprintf(w, "<p class=\"legend\">%s.</p>\n", html.EscapeString(r.legendText()))
}
