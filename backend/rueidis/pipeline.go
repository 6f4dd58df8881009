package rueidis

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
)

// Pipeline sizing for RunMany, chosen with BenchmarkRunMany and
// BenchmarkRunManyLiveLatency. A DoMulti of fewer than BlockingPipeline
// (2000) commands is written on the shared, automatically pipelined
// connection, where a concurrent Run call waits behind every call in flight:
// with 1000-call chunks, 4 at a time, Run calls made during a 100k batch had
// a 99th percentile near 20 ms (40 ms on a busy machine), most of a
// limiter's deadline. 500 calls in flight keep it near 2 ms and come within
// about 10% of their throughput. They are variables so that the benchmarks
// can compare others.
var (
	// pipelineChunk is the most calls sent in one DoMulti.
	pipelineChunk = 250
	// pipelineWorkers is the most DoMulti calls in flight at once.
	pipelineWorkers = 2
)

var _ core.Pipeliner = (*Store)(nil)

// RunMany runs calls in DoMulti batches of EVALSHA commands and returns their
// outcomes in the order of calls, each mapped as Run maps it. For a Redis
// Cluster, rueidis splits each batch by node. Calls the server refused with
// NOSCRIPT (not run) are sent once more after SCRIPT LOAD of their scripts on
// every node; unlike rueidis's Lua.ExecMulti, RunMany does not pay a SCRIPT
// LOAD round trip when the scripts are cached. Nothing else is retried: like
// Run, a call that fails after it was sent has an unknown outcome.
func (s *Store) RunMany(ctx context.Context, calls []core.Call) []core.CallResult {
	out := make([]core.CallResult, len(calls))
	chunk, workers := pipelineChunk, pipelineWorkers
	n := (len(calls) + chunk - 1) / chunk
	runChunk := func(i int) {
		lo, hi := i*chunk, min((i+1)*chunk, len(calls))
		s.runChunk(ctx, calls[lo:hi], out[lo:hi])
	}
	if workers <= 1 || n <= 1 {
		for i := range n {
			runChunk(i)
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				runChunk(i)
			}
		})
	}
	wg.Wait()
	return out
}

// runChunk runs calls in one DoMulti, then sends the calls refused with
// NOSCRIPT again, once, after loading their scripts.
func (s *Store) runChunk(ctx context.Context, calls []core.Call, out []core.CallResult) {
	idx := make([]int, len(calls))
	for i := range idx {
		idx[i] = i
	}
	refused := s.exec(ctx, calls, idx, out)
	if len(refused) == 0 {
		return
	}
	loaded := make(map[*core.Script]error)
	again := refused[:0]
	for _, i := range refused {
		sc := calls[i].Script
		err, ok := loaded[sc]
		if !ok {
			err = s.load(ctx, sc)
			loaded[sc] = err
		}
		if err != nil {
			out[i].Err = classify(sc.Name()+": SCRIPT LOAD", err)
			continue
		}
		again = append(again, i)
	}
	if len(again) > 0 {
		// A NOSCRIPT now (the cache was flushed again) stays an error.
		s.exec(ctx, calls, again, out)
	}
}

// exec sends calls[i], for each i in idx, in one DoMulti and stores each
// outcome in out[i]. It returns the indexes the server refused with NOSCRIPT;
// their outcome is that error until they are sent again.
func (s *Store) exec(ctx context.Context, calls []core.Call, idx []int, out []core.CallResult) (refused []int) {
	cmds := make(rueidis.Commands, len(idx))
	for j, i := range idx {
		c := calls[i]
		cmds[j] = s.c.B().Evalsha().Sha1(c.Script.SHA1()).Numkeys(int64(len(c.Keys))).Key(c.Keys...).Arg(c.Args...).Build()
	}
	res := s.c.DoMulti(ctx, cmds...) // recycles cmds
	for j, i := range idx {
		out[i].Reply, out[i].Err = parse(calls[i].Script.Name(), res[j])
		if rerr, ok := rueidis.IsRedisErr(res[j].Error()); ok && rerr.IsNoScript() {
			refused = append(refused, i)
		}
	}
	return refused
}

// load runs SCRIPT LOAD of sc on every node, in parallel, and returns the
// first error.
func (s *Store) load(ctx context.Context, sc *core.Script) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, n := range s.c.Nodes() {
		wg.Go(func() {
			err := n.Do(ctx, n.B().ScriptLoad().Script(sc.Source()).Build()).Error()
			mu.Lock()
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return first
}
