package goredis

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/pipeline"
)

// sizing is how RunMany splits a batch, chosen with BenchmarkRunMany and
// BenchmarkRunManyLiveLatency. go-redis gives all the replies of a pipeline
// one read deadline, ReadTimeout (or the context's deadline if earlier), and
// the server works through every pipeline in flight at once, so the calls in
// flight must run well within that deadline. With 1000-call chunks, 2 or 4
// at a time, 100k batches on a busy machine lost whole chunks to i/o
// timeouts under the default 50 ms, each call an unknown outcome; 500 calls
// in flight lost none, came within about 10% of their throughput, and halve
// the latency they add to concurrent Run calls. It is a variable so that
// the benchmarks can compare others. MaxArgs bounds a chunk's work too:
// replay batches of hot keys carry hundreds of grants each, and 250 of them
// overran the read deadline again and again (the benchmark harness's outage
// section saw go-redis take up to 20 s to close its breaker after Redis came
// back).
var sizing = pipeline.Sizing{Chunk: 250, Workers: 2, MaxArgs: 1000}

// RunMany runs calls in pipelines of EVALSHA commands and returns their
// outcomes in the order of calls, each mapped as Run maps it. For a Redis
// Cluster, go-redis splits each pipeline by node. Calls the server refused
// with NOSCRIPT (not run) are sent once more after SCRIPT LOAD of their
// scripts, on every node for a cluster. Nothing else is retried: like Run, a
// call that fails after it was sent has an unknown outcome.
func (s *Store) RunMany(ctx context.Context, calls []driver.Call) []driver.CallResult {
	b := pipeline.Batch{Exec: s.exec, Load: s.load, Classify: classify}
	return b.RunMany(ctx, calls, sizing)
}

// load runs SCRIPT LOAD of sc; on a ClusterClient, on every shard.
func (s *Store) load(ctx context.Context, sc *driver.Script) error {
	return s.script(sc).rs.Load(ctx, s.c).Err()
}

// exec sends calls[i], for each i in idx, in one pipeline and stores each
// outcome in out[i]. It returns the indexes the server refused with NOSCRIPT;
// their outcome is that error until they are sent again.
func (s *Store) exec(ctx context.Context, calls []driver.Call, idx []int, out []driver.CallResult) (refused []int) {
	cmds := make([]*redis.Cmd, len(idx))
	// The pipeline's own error is also each failed command's error.
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			c := calls[i]
			argv := make([]any, 3+len(c.Keys)+len(c.Args))
			argv[0], argv[1], argv[2] = "evalsha", s.script(c.Script).sha, len(c.Keys)
			for k, key := range c.Keys {
				argv[3+k] = key
			}
			for k, a := range c.Args {
				argv[3+len(c.Keys)+k] = a
			}
			cmds[j] = redis.NewCmd(ctx, argv...)
			if len(c.Keys) > 0 {
				cmds[j].SetFirstKeyPos(3)
			}
			_ = p.Process(ctx, cmds[j])
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
			out[i] = driver.CallResult{Err: classify(name, err)}
			refused = append(refused, i)
		default:
			out[i] = driver.CallResult{Err: classify(name, err)}
		}
	}
	return refused
}

// commandSizing is how RunCommands splits its commands: a plain command
// is a few µs of Redis time at most, where a replay call is tens, so a
// pipeline carries more of them within the same read deadline. One chunk
// at a time keeps the commands in order (a reconciler sends several
// RunCommands at once; 2 workers a call replayed 100k keys no faster).
var commandSizing = pipeline.Sizing{Chunk: 1000, Workers: 1, MaxArgs: 4000}

// RunCommands sends cmds (each its name, its key and its arguments) in
// pipelines, in order, each after the replies of the one before, and
// returns each command's error, mapped as Run maps errors (a nil reply is
// a success). For a Redis Cluster, go-redis routes each command by its
// key. Nothing is retried.
func (s *Store) RunCommands(ctx context.Context, cmds [][]string) []error {
	if ctx == nil {
		return pipeline.Failed(len(cmds), core.ErrNilContext)
	}
	return pipeline.ChunkedBy(cmds, commandSizing, func(c []string) int { return len(c) }, func(cmds [][]string, out []error) {
		rc := make([]*redis.Cmd, len(cmds))
		// The pipeline's own error is also each failed command's error.
		_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, c := range cmds {
				argv := make([]any, len(c))
				for k, a := range c {
					argv[k] = a
				}
				rc[j] = redis.NewCmd(ctx, argv...)
				rc[j].SetFirstKeyPos(1)
				_ = p.Process(ctx, rc[j])
			}
			return nil
		})
		for j, c := range cmds {
			if err := rc[j].Err(); err != nil && !replyErrors.IsNil(err) {
				out[j] = classify(c[0], err)
			}
		}
	})
}

var _ driver.Commander = (*Store)(nil)
