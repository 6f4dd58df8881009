package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress writes the live line: on a terminal one \r-updated line four
// times a second, elsewhere (a log, a test) a line every five seconds.
// Events (the kill, the restart) get lines of their own.
type progress struct {
	w       io.Writer
	tty     bool
	start   time.Time
	total   time.Duration
	clients []*client
	pl      *poller
	mu      sync.Mutex
}

func newProgress(w io.Writer, start time.Time, total time.Duration, clients []*client, pl *poller) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{w: w, tty: tty, start: start, total: total, clients: clients, pl: pl}
}

// line returns the progress line now.
func (p *progress) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.1fs/%v", time.Since(p.start).Seconds(), p.total)
	adm, rej := liveTotals(p.clients)
	for i, cl := range p.clients {
		fmt.Fprintf(&b, "  %s %d/%d", cl.series.Name(), adm[i], rej[i])
	}
	b.WriteString("  breakers ")
	for _, st := range p.pl.current() {
		b.WriteString(stateLetter(st))
	}
	return b.String()
}

// event writes msg on a line of its own, stamped with the run time.
func (p *progress) event(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "[%5.1fs] %s\n", time.Since(p.start).Seconds(), msg)
}

// run updates the line until done is closed or ctx ends.
func (p *progress) run(ctx context.Context, done <-chan struct{}) {
	every := 5 * time.Second
	if p.tty {
		every = 250 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			if p.tty {
				p.mu.Lock()
				fmt.Fprintf(p.w, "\r\033[K%s\n", p.line())
				p.mu.Unlock()
			}
			return
		case <-t.C:
		}
		p.mu.Lock()
		if p.tty {
			fmt.Fprintf(p.w, "\r\033[K%s", p.line())
		} else {
			fmt.Fprintln(p.w, p.line())
		}
		p.mu.Unlock()
	}
}
