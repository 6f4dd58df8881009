package reconcile

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// DefaultFreshMin is Options.FreshMin's default: a replay of fewer
// batches goes to the replay scripts alone, as a batch replayed on the
// request path does, which one round trip more (the Redis time, then the
// fresh calls) would delay.
const DefaultFreshMin = 64

// freshClock returns the estimate of Redis's clock that FreshWrites get
// when a replay of n batches into store sends fresh calls first, or nil
// when it does not. The estimate is a lower bound: the Redis time that
// TIME replied plus the time since its reply arrived, which a call sent
// after that cannot run before. On Redis Cluster (cluster) the keys live
// on masters of clocks of their own, which one TIME does not bound: there
// every batch goes to its replay script.
func (r *Reconciler) freshClock(ctx context.Context, store driver.Store, n int, cluster bool) func() int64 {
	if r.o.FreshMin < 0 || n < r.o.FreshMin || cluster || driver.IsLocal(store) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.CallTimeout)
	defer cancel()
	reply, err := store.Run(ctx, driver.TimeScript, nil, nil)
	got := time.Now()
	if err != nil || len(reply) != 2 || reply[0] <= 0 || reply[1] < 0 || reply[1] >= 1_000_000 {
		// The replay scripts alone: they report what is wrong.
		return nil
	}
	at := reply[0]*1_000_000 + reply[1]
	return func() int64 { return at + time.Since(got).Microseconds() }
}

// prepareFresh returns the fresh calls of the batches in of whose
// algorithm is a driver.FreshReplayer, with now a lower bound of the Redis
// time they run at, their parts in prep (which prepare overwrites for
// those sent to the replay script after), and appends the others' indices
// to rest.
func (r *Reconciler) prepareFresh(batches []driver.Batch, of []int, cluster bool, now int64, prep []prepared, rest []int) ([]unit, []int) {
	o := driver.ReplayOptions{MergeWindow: r.o.MergeWindow}
	idx := make([]int, 0, len(of))
	// Every batch's words go into one buffer (a token bucket's are 5),
	// each batch's Args its part.
	buf := make([]string, 0, 8*len(of))
	for _, i := range of {
		b := &batches[i]
		fr, ok := b.Policy.Algorithm().(driver.FreshReplayer)
		if !b.Policy.Valid() || !ok {
			rest = append(rest, i)
			continue
		}
		n := len(buf)
		buf, ok = fr.FreshWrites(buf, b, o, now)
		words := buf[n:len(buf):len(buf)]
		if !ok {
			buf = buf[:n]
			rest = append(rest, i)
			continue
		}
		marker, field := markerOf(b.Key, b.ID, cluster)
		prep[i] = preparedOf(group{script: driver.FreshScript, marker: marker}, nil, driver.ReplayBatch{Key: b.Key, Field: field, Args: words})
		idx = append(idx, i)
	}
	return r.plan(prep, idx), rest
}

// sendFresh runs the fresh calls units, records the batches they
// acknowledged (applied now or before) and those whose store was
// unavailable in errs, and returns the others, for the replay script: a
// key that exists, a batch whose writes failed, a call Redis refused. It
// sets existing when most of the batches' keys existed.
func (r *Reconciler) sendFresh(ctx context.Context, store driver.Store, batches []driver.Batch, units []unit, errs []error, sem chan struct{}, existing *atomic.Bool) (again []int) {
	results := r.run(ctx, store, units, sem)
	var n, exists int
	for u := range units {
		idx, res := units[u].batches, results[u]
		n += len(idx)
		var se *core.StoreError
		switch {
		case res.Err != nil && errors.As(res.Err, &se) && !se.Answered:
			// Redis did not answer: the replay script would not get
			// through either. The batches stay in the log; their markers
			// count them once whatever this call did.
			for _, i := range idx {
				errs[i] = check(&batches[i], nil, res.Err)
			}
			continue
		case res.Err != nil || len(res.Reply) != len(idx):
			again = append(again, idx...)
			continue
		}
		for j, i := range idx {
			switch res.Reply[j] {
			case driver.FreshApplied, driver.FreshBefore:
				errs[i] = nil
			case driver.FreshExists:
				exists++
				again = append(again, i)
			default:
				again = append(again, i)
			}
		}
	}
	if exists*2 > n {
		existing.Store(true)
	}
	return again
}
