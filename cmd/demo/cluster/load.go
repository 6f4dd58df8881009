package cluster

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// counts are one client's per-second counters, written by many request
// goroutines.
type counts struct {
	admitted, rejected, errors, server, local []atomic.Int64
}

func newCounts(secs int) *counts {
	return &counts{
		admitted: make([]atomic.Int64, secs), rejected: make([]atomic.Int64, secs),
		errors: make([]atomic.Int64, secs), server: make([]atomic.Int64, secs), local: make([]atomic.Int64, secs),
	}
}

func snapshot(xs []atomic.Int64) []int {
	out := make([]int, len(xs))
	for i := range xs {
		out[i] = int(xs[i].Load())
	}
	return out
}

// client is one load client: a fixed schedule of requests with its
// X-Client-ID on one route, open-loop (a slow answer delays nothing).
type client struct {
	series *Series
	url    string
	c      *counts
	// down is set while Redis (or the killed master) is down; the requests
	// sent meanwhile have their decisions counted by mode in outage.
	down     *atomic.Bool
	outageMu sync.Mutex
	outage   map[string]int
}

// run sends the client's requests at rate per second from start for d, each
// in its own goroutine, and returns when all have answered (each is bounded
// by the HTTP client's timeout) or ctx ended. Its request count is fixed:
// rate × d, one request at a random instant of each 1/rate slot.
//
// The jitter matters: with strictly periodic clients the merged request
// stream is periodic too, nginx's round robin locks onto its phase, and a
// client's requests all land on the same one or two instances. During an
// outage each instance enforces only its 1/N share, so a gentle client
// pinned to one instance would be rejected: real clients are not
// phase-locked to the load balancer, and DESIGN.md's promise is for traffic
// spread over the instances.
func (cl *client) run(ctx context.Context, hc *http.Client, start time.Time, d time.Duration) {
	n := int(cl.series.Rate * d.Seconds())
	every := float64(time.Second) / cl.series.Rate
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range n {
		at := start.Add(time.Duration((float64(i) + rand.Float64()) * every))
		if at.Sub(start) >= d {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		sec := int(at.Sub(start) / time.Second)
		wg.Go(func() { cl.do(ctx, hc, sec) })
	}
}

// body is the part of httplimit's JSON answer the load reads.
type body struct {
	Mode string `json:"mode"`
}

func (cl *client) do(ctx context.Context, hc *http.Client, sec int) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.url, nil)
	if err != nil {
		cl.c.errors[sec].Add(1)
		return
	}
	req.Header.Set("X-Client-ID", cl.series.Client)
	down := cl.down != nil && cl.down.Load()
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			cl.c.errors[sec].Add(1)
		}
		return
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var b body
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
		if json.Unmarshal(raw, &b) != nil || b.Mode == "" {
			b.Mode = "?"
		}
		if down {
			cl.outageMu.Lock()
			if cl.outage == nil {
				cl.outage = map[string]int{}
			}
			cl.outage[b.Mode]++
			cl.outageMu.Unlock()
		}
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		cl.c.admitted[sec].Add(1)
		if b.Mode == "local" {
			cl.c.local[sec].Add(1)
		}
	case resp.StatusCode == http.StatusTooManyRequests:
		cl.c.rejected[sec].Add(1)
	case resp.StatusCode >= 500:
		cl.c.server[sec].Add(1)
		cl.c.errors[sec].Add(1)
	default:
		cl.c.errors[sec].Add(1)
	}
}

// fill copies the counters into the client's series.
func (cl *client) fill() {
	s := cl.series
	s.Admitted, s.Rejected = snapshot(cl.c.admitted), snapshot(cl.c.rejected)
	s.Errors, s.ServerErrors, s.Local = snapshot(cl.c.errors), snapshot(cl.c.server), snapshot(cl.c.local)
	cl.outageMu.Lock()
	s.OutageModes = maps.Clone(cl.outage)
	cl.outageMu.Unlock()
}

// drive runs every client from start for d and fills their series.
func drive(ctx context.Context, clients []*client, start time.Time, d time.Duration) {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
	}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Go(func() { cl.run(ctx, hc, start, d) })
	}
	wg.Wait()
	for _, cl := range clients {
		cl.fill()
	}
}

// liveTotals returns each client's admitted and rejected so far.
func liveTotals(clients []*client) (adm, rej []int) {
	for _, cl := range clients {
		adm = append(adm, Total(snapshot(cl.c.admitted)))
		rej = append(rej, Total(snapshot(cl.c.rejected)))
	}
	return adm, rej
}
