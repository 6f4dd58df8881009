package goredis

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core"
)

// Pipeline sizing for RunMany, chosen with BenchmarkRunMany and
// BenchmarkRunManyLiveLatency. go-redis gives all the replies of a pipeline
// one read deadline, ReadTimeout (or the context's deadline if earlier), and
// the server works through every pipeline in flight at once, so the calls in
// flight must run well within that deadline. With 1000-call chunks, 2 or 4
// at a time, 100k batches on a busy machine lost whole chunks to i/o
// timeouts under the default 50 ms, each call an unknown outcome; 500 calls
// in flight lost none, came within about 10% of their throughput, and halve
// the latency they add to concurrent Run calls. They are variables so that
// the benchmarks can compare others.
var (
	// pipelineChunk is the most calls sent in one pipeline.
	pipelineChunk = 250
	// pipelineWorkers is the most pipelines in flight at once, each on its
	// own pooled connection.
	pipelineWorkers = 2
)

var _ core.Pipeliner = (*Store)(nil)

// RunMany runs calls in pipelines of EVALSHA commands and returns their
// outcomes in the order of calls, each mapped as Run maps it. For a Redis
// Cluster, go-redis splits each pipeline by node. Calls the server refused
// with NOSCRIPT (not run) are sent once more after SCRIPT LOAD of their
// scripts, on every node for a cluster. Nothing else is retried: like Run, a
// call that fails after it was sent has an unknown outcome.
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

// runChunk runs calls in one pipeline, then sends the calls refused with
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
			// On a ClusterClient, SCRIPT LOAD runs on every shard.
			err = s.script(sc).Load(ctx, s.c).Err()
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

// exec sends calls[i], for each i in idx, in one pipeline and stores each
// outcome in out[i]. It returns the indexes the server refused with NOSCRIPT;
// their outcome is that error until they are sent again.
func (s *Store) exec(ctx context.Context, calls []core.Call, idx []int, out []core.CallResult) (refused []int) {
	cmds := make([]*redis.Cmd, len(idx))
	// The pipeline's own error is also each failed command's error.
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			c := calls[i]
			argv := make([]any, len(c.Args))
			for k, a := range c.Args {
				argv[k] = a
			}
			cmds[j] = p.EvalSha(ctx, c.Script.SHA1(), c.Keys, argv...)
		}
		return nil
	})
	for j, i := range idx {
		name := calls[i].Script.Name()
		v, err := cmds[j].Result()
		switch {
		case err == nil:
			out[i].Reply, out[i].Err = parse(name, v)
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			out[i] = core.CallResult{Err: classify(name, err)}
			refused = append(refused, i)
		default:
			out[i] = core.CallResult{Err: classify(name, err)}
		}
	}
	return refused
}
