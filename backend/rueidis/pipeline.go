package rueidis

import (
	"context"
	"sync"

	"github.com/redis/rueidis"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// sizing is how RunMany splits a batch, chosen with BenchmarkRunMany and
// BenchmarkRunManyLiveLatency. A DoMulti of fewer than BlockingPipeline
// (2000) commands is written on the shared, automatically pipelined
// connection, where a concurrent Run call waits behind every call in flight:
// with 1000-call DoMulti chunks, 4 at a time, Run calls made during a 100k batch had
// a 99th percentile near 20 ms (40 ms on a busy machine), most of a
// limiter's deadline. 500 calls in flight keep it near 2 ms and come within
// about 10% of their throughput. MaxArgs bounds a chunk's work as well:
// a reconcile's multi-batch calls carry up to 16 batches each (about six
// at 100k keys), and 250 of them would be about 22 ms of Redis time, where
// 4000 keys and arguments are about 280 replayed batches, 4 ms (the replay
// of 100k keys took as long either way). It is a variable so that the benchmarks can compare
// others.
var sizing = pipeline.Sizing{Chunk: 250, Workers: 2, MaxArgs: 4000}

// RunMany runs calls in DoMulti batches of EVALSHA commands and returns their
// outcomes in the order of calls, each mapped as Run maps it. For a Redis
// Cluster, rueidis splits each batch by node. Calls the server refused with
// NOSCRIPT (not run) are sent once more after SCRIPT LOAD of their scripts on
// every node; unlike rueidis's Lua.ExecMulti, RunMany does not pay a SCRIPT
// LOAD round trip when the scripts are cached. Nothing else is retried: like
// Run, a call that fails after it was sent has an unknown outcome.
func (s *Store) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	b := pipeline.Batch{Exec: s.exec, Load: s.load, Classify: classify}
	return b.RunMany(ctx, calls, sizing)
}

// exec sends calls[i], for each i in idx, in one DoMulti and stores each
// outcome in out[i]. It returns the indexes the server refused with NOSCRIPT;
// their outcome is that error until they are sent again.
func (s *Store) exec(ctx context.Context, calls []driver.Call, idx []int, out []driver.CallResult) (refused []int) {
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
func (s *Store) load(ctx context.Context, sc *driver.Script) error {
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

// commandSizing is how RunCommands splits its commands: a plain command
// is a few µs of Redis time at most, where a replay call is tens, so a
// DoMulti carries more of them for the same wait of a concurrent Run call.
// It stays below BlockingPipeline (2000), on the shared connection. One
// chunk at a time keeps the commands in order (a reconciler sends several
// RunCommands at once; 2 workers a call replayed 100k keys no faster).
var commandSizing = pipeline.Sizing{Chunk: 1000, Workers: 1, MaxArgs: 4000}

// RunCommands sends cmds (each its name, its key and its arguments) in
// DoMulti batches, in order, each after the replies of the one before, and
// returns each command's error, mapped as Run maps errors (a nil reply is
// a success). For a Redis Cluster, rueidis routes each command by its key.
// Nothing is retried: rueidis retries no command built with Arbitrary.
func (s *Store) RunCommands(ctx context.Context, cmds [][]string) []error {
	if ctx == nil {
		return pipeline.Failed(len(cmds), core.ErrNilContext)
	}
	return pipeline.ChunkedBy(cmds, commandSizing, func(c []string) int { return len(c) }, func(cmds [][]string, out []error) {
		rc := make(rueidis.Commands, len(cmds))
		for j, c := range cmds {
			rc[j] = s.c.B().Arbitrary(c[0]).Keys(c[1]).Args(c[2:]...).Build()
		}
		for j, res := range s.c.DoMulti(ctx, rc...) { // recycles rc
			if err := res.Error(); err != nil && !replyErrors.IsNil(err) {
				out[j] = classify(cmds[j][0], err)
			}
		}
	})
}

var _ driver.Commander = (*Store)(nil)
