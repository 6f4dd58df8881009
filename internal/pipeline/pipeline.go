// Package pipeline is the client-independent half of the Redis backends'
// Store: RunMany's split of a batch into chunks sent with bounded
// concurrency, its second sending of the calls a server refused with
// NOSCRIPT, and the mapping of a client's errors onto core's errors that Run
// and RunMany share. Each backend supplies what its client does differently:
// how a chunk is sent, how a script is loaded, how an error reply is
// recognised.
package pipeline

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// Sizing is how RunMany splits a batch.
type Sizing struct {
	// Chunk is the most calls sent in one pipeline. It must be positive.
	Chunk int
	// Workers is the most pipelines in flight at once, each on a
	// connection of its own or sharing one, as the client does it. 1 or
	// less sends them one after another on the calling goroutine.
	Workers int
	// MaxArgs, when positive, also ends a chunk before its keys and
	// arguments together pass MaxArgs (a chunk holds at least one call).
	// A script's work grows with its arguments (a replay batch carries two
	// per grant), and a client that bounds the read of a whole pipeline
	// with one deadline (go-redis' ReadTimeout) needs the pipeline's work
	// bounded, not just its count.
	MaxArgs int
}

// Chunked returns the outcomes of calls, in the order of calls. It splits
// calls into chunks of at most sz.Chunk calls and calls run once for each
// chunk with the chunk and the part of the outcomes that is the chunk's to
// fill, with at most sz.Workers chunks in flight at once.
func Chunked[C, R any](calls []C, sz Sizing, run func(calls []C, out []R)) []R {
	return ChunkedBy(calls, sz, nil, run)
}

// ChunkedBy is Chunked with each call's weight (its keys and arguments) for
// sz.MaxArgs; a nil weight counts calls only.
func ChunkedBy[C, R any](calls []C, sz Sizing, weight func(C) int, run func(calls []C, out []R)) []R {
	out := make([]R, len(calls))
	workers := sz.Workers
	var bounds []int // chunk i is calls[bounds[i]:bounds[i+1]]
	for lo := 0; lo < len(calls); {
		bounds = append(bounds, lo)
		hi, w := lo, 0
		for hi < len(calls) && hi-lo < sz.Chunk {
			cw := 0
			if weight != nil && sz.MaxArgs > 0 {
				cw = weight(calls[hi])
				if hi > lo && w+cw > sz.MaxArgs {
					break
				}
			}
			w += cw
			hi++
		}
		lo = hi
	}
	bounds = append(bounds, len(calls))
	n := len(bounds) - 1
	runChunk := func(i int) {
		lo, hi := bounds[i], bounds[i+1]
		run(calls[lo:hi], out[lo:hi])
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

// A Batch is what RunMany needs of a client: the client-specific halves of a
// backend's RunMany.
type Batch struct {
	// Exec sends calls[i], for each i in idx, in one pipeline and stores
	// each outcome in out[i], mapped as Run maps it. It returns the indexes
	// the server refused with NOSCRIPT (not run); their outcome is that
	// error until they are sent again.
	Exec func(ctx context.Context, calls []driver.Call, idx []int, out []driver.CallResult) (refused []int)
	// Load loads script sc on every node of the client.
	Load func(ctx context.Context, sc *driver.Script) error
	// Classify maps an error of Load as Run maps errors.
	Classify func(name string, err error) error
}

// RunMany runs calls in pipelines sized by sz and returns their outcomes in
// the order of calls. In each pipeline the calls refused with NOSCRIPT are
// sent once more after Load of their scripts; nothing else is retried.
func (b Batch) RunMany(ctx context.Context, calls []driver.Call, sz Sizing) []driver.CallResult {
	if ctx == nil {
		out := make([]driver.CallResult, len(calls))
		for i := range out {
			out[i].Err = core.ErrNilContext
		}
		return out
	}
	return ChunkedBy(calls, sz, func(c driver.Call) int { return len(c.Keys) + len(c.Args) }, func(calls []driver.Call, out []driver.CallResult) {
		b.runChunk(ctx, calls, out)
	})
}

// runChunk runs calls in one pipeline, then sends the calls refused with
// NOSCRIPT again, once, after loading their scripts.
func (b Batch) runChunk(ctx context.Context, calls []driver.Call, out []driver.CallResult) {
	idx := make([]int, len(calls))
	for i := range idx {
		idx[i] = i
	}
	refused := b.Exec(ctx, calls, idx, out)
	if len(refused) == 0 {
		return
	}
	loaded := make(map[*driver.Script]error)
	again := refused[:0]
	for _, i := range refused {
		sc := calls[i].Script
		err, ok := loaded[sc]
		if !ok {
			err = b.Load(ctx, sc)
			loaded[sc] = err
		}
		if err != nil {
			out[i].Err = b.Classify(sc.Name()+": SCRIPT LOAD", err)
			continue
		}
		again = append(again, i)
	}
	if len(again) > 0 {
		// A NOSCRIPT now (the cache was flushed again) stays an error.
		b.Exec(ctx, calls, again, out)
	}
}

// Failed returns n copies of err: the outcomes of n commands that were
// not sent.
func Failed(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}
