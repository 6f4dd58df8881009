package metrics

import (
	"context"
	"time"

	"github.com/holdfast/holdfast/core/driver"
)

// Store returns s timing every call into the Redis latency histogram:
// Run by script name, Ping as "ping", RunMany as "pipeline" and
// RunCommands as "commands" (one observation per call of either). Errors are observed too, with outcome
// "error": a call that hit its deadline shows up in the top buckets.
//
// The returned store has exactly the optional capabilities of s
// (driver.Pinger, driver.Pipeliner, driver.Commander with both;
// driver.Sharded through Unwrap), so callers that look for them by type
// assertion, such as the fallback layer's health probe and the
// reconciler's pipelining, behave as they would with s itself.
func (m *Metrics) Store(s driver.Store) driver.Store {
	t := &timed{next: s, m: m}
	p, ping := s.(driver.Pinger)
	pl, pipe := s.(driver.Pipeliner)
	cm, cmds := s.(driver.Commander)
	switch {
	case ping && pipe && cmds:
		return &timedPingPipeCmds{timedPingPipe{timed: t, pinger: p, pipeliner: pl}, cm}
	case ping && pipe:
		return &timedPingPipe{timed: t, pinger: p, pipeliner: pl}
	case ping:
		return &timedPing{timed: t, pinger: p}
	case pipe:
		return &timedPipe{timed: t, pipeliner: pl}
	}
	return t
}

type timed struct {
	next driver.Store
	m    *Metrics
}

var _ driver.Store = (*timed)(nil)

func (t *timed) observe(script string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
		t.m.storeError(err)
	}
	t.m.calls.WithLabelValues(script, outcome).Observe(time.Since(start).Seconds())
}

// Unwrap returns the wrapped store, so that its other optional interfaces
// (driver.Sharded) can be found with driver.ShardedOf.
func (t *timed) Unwrap() driver.Store { return t.next }

// Run times one script call.
func (t *timed) Run(ctx context.Context, s *driver.Script, keys, args []string) ([]int64, error) {
	start := time.Now()
	r, err := t.next.Run(ctx, s, keys, args)
	t.observe(s.Name(), start, err)
	return r, err
}

func (t *timed) ping(ctx context.Context, p driver.Pinger) error {
	start := time.Now()
	err := p.Ping(ctx)
	t.observe("ping", start, err)
	return err
}

func (t *timed) runMany(ctx context.Context, pl driver.Pipeliner, calls []driver.Call) []driver.CallResult {
	start := time.Now()
	res := pl.RunMany(ctx, calls)
	var err error
	for _, r := range res {
		if r.Err != nil {
			err = r.Err
			break
		}
	}
	t.observe("pipeline", start, err)
	return res
}

type timedPing struct {
	*timed
	pinger driver.Pinger
}

// Ping times a health check.
func (t *timedPing) Ping(ctx context.Context) error { return t.ping(ctx, t.pinger) }

type timedPipe struct {
	*timed
	pipeliner driver.Pipeliner
}

// RunMany times one pipeline.
func (t *timedPipe) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	return t.runMany(ctx, t.pipeliner, calls)
}

type timedPingPipe struct {
	*timed
	pinger    driver.Pinger
	pipeliner driver.Pipeliner
}

// Ping times a health check.
func (t *timedPingPipe) Ping(ctx context.Context) error { return t.ping(ctx, t.pinger) }

// RunMany times one pipeline.
func (t *timedPingPipe) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	return t.runMany(ctx, t.pipeliner, calls)
}

// timedPingPipeCmds is timedPingPipe of a store that is also a
// driver.Commander: both Redis backends' stores.
type timedPingPipeCmds struct {
	timedPingPipe
	commander driver.Commander
}

// RunCommands times one call of plain commands.
func (t *timedPingPipeCmds) RunCommands(ctx context.Context, cmds [][]string) []error {
	start := time.Now()
	errs := t.commander.RunCommands(ctx, cmds)
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	t.observe("commands", start, err)
	return errs
}

var (
	_ driver.Commander = (*timedPingPipeCmds)(nil)
	_ driver.Pinger    = (*timedPing)(nil)
	_ driver.Pipeliner = (*timedPipe)(nil)
	_ driver.Pinger    = (*timedPingPipe)(nil)
	_ driver.Pipeliner = (*timedPingPipe)(nil)
)
