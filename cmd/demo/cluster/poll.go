package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/holdfast/holdfast/cmd/demo/serve"
)

// pollEvery is how often the poller reads each instance's /status: four
// times a second, so a short reconciling phase is seen; the table shows
// the last state of each second.
const pollEvery = 250 * time.Millisecond

// poller reads every instance's /status during the run.
type poller struct {
	hc    *http.Client
	urls  []string // each instance's /status
	start time.Time

	mu          sync.Mutex
	breakers    [][]string // per second, per instance
	pending     []int
	baseRecon   uint64 // reconciles summed before the kill
	restartAt   time.Duration
	reconciled  time.Duration
	recovered   time.Duration
	lastBreaker []string
	down        bool                      // between the kill and the restart
	shardStates map[string]map[string]int // shard slots → breaker state → count, while down
}

func newPoller(urls []string, start time.Time, secs int) *poller {
	p := &poller{hc: &http.Client{Timeout: 300 * time.Millisecond}, urls: urls, start: start,
		breakers: make([][]string, secs), pending: make([]int, secs),
		restartAt: -1, reconciled: -1, recovered: -1, lastBreaker: make([]string, len(urls))}
	for i := range p.lastBreaker {
		p.lastBreaker[i] = "?"
	}
	return p
}

// statuses reads every instance's /status; a failed read leaves ok false.
func (p *poller) statuses(ctx context.Context) (sts []serve.Status, ok []bool) {
	sts, ok = make([]serve.Status, len(p.urls)), make([]bool, len(p.urls))
	var wg sync.WaitGroup
	for i, u := range p.urls {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return
			}
			resp, err := p.hc.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			ok[i] = resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&sts[i]) == nil
		})
	}
	wg.Wait()
	return sts, ok
}

// markKilled records the reconcile count before the outage.
func (p *poller) markKilled(ctx context.Context) {
	sts, _ := p.statuses(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range sts {
		p.baseRecon += st.Reconciles
	}
}

// markDown records that Redis (or a master) was just killed: until
// markRestarted the polls tally each shard's breaker states.
func (p *poller) markDown() {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
}

// markRestarted records when Redis came back.
func (p *poller) markRestarted(at time.Duration) {
	p.mu.Lock()
	p.restartAt = at
	p.down = false
	p.mu.Unlock()
}

// run polls until ctx ends.
func (p *poller) run(ctx context.Context) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		p.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *poller) once(ctx context.Context) {
	sts, ok := p.statuses(ctx)
	at := time.Since(p.start)
	sec := int(at / time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	var recon uint64
	pending, closed := 0, true
	for i, st := range sts {
		state := "?"
		if ok[i] {
			state = st.Breaker
		}
		p.lastBreaker[i] = state
		if p.down && ok[i] {
			for _, sh := range st.Shards {
				if p.shardStates == nil {
					p.shardStates = map[string]map[string]int{}
				}
				if p.shardStates[sh.Slots] == nil {
					p.shardStates[sh.Slots] = map[string]int{}
				}
				p.shardStates[sh.Slots][sh.Breaker]++
			}
		}
		recon += st.Reconciles
		pending += st.PendingLog
		closed = closed && state == "closed"
	}
	if p.restartAt >= 0 && at >= p.restartAt {
		if p.reconciled < 0 && recon > p.baseRecon {
			p.reconciled = at
		}
		if p.recovered < 0 && closed {
			p.recovered = at
		}
	}
	if sec >= 0 && sec < len(p.breakers) {
		p.breakers[sec] = append([]string(nil), p.lastBreaker...)
		p.pending[sec] = pending
	}
}

// current returns the last breaker states seen.
func (p *poller) current() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lastBreaker...)
}

// fill copies what the poller saw into r; a second without a poll repeats
// the one before.
func (p *poller) fill(r *Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.Breakers, r.Pending = make([][]string, len(p.breakers)), append([]int(nil), p.pending...)
	prev := make([]string, len(p.urls))
	for i := range prev {
		prev[i] = "?"
	}
	for s, b := range p.breakers {
		if b == nil {
			b = prev
		}
		r.Breakers[s], prev = b, b
	}
	r.ReconciledAt, r.RecoveredAt = p.reconciled, p.recovered
	if r.Cluster != nil {
		r.Cluster.Breakers = p.shardStates
	}
}
