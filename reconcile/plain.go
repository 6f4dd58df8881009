package reconcile

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// plainWrites are the plain commands of a slice's batches
// (driver.PlainReplayer): cmds, and of each the batch it is of.
type plainWrites struct {
	cmds [][]string
	of   []int
}

// preparePlain returns the plain commands of the batches idx whose
// algorithm is a driver.PlainReplayer, with now a lower bound of the Redis
// time they run at, and the indices of the others. A batch whose key is
// also a batch's that goes to a script goes to the scripts too: a script
// may write a seed into a missing key, which a plain write before it
// would have created.
func (r *Reconciler) preparePlain(batches []driver.Batch, idx []int, now int64) (plainWrites, []int) {
	o := driver.ReplayOptions{MergeWindow: r.o.MergeWindow}
	// Every batch's words go into one buffer (a batch of three grants has
	// 16): batch i's are buf[from[i]:to[i]].
	buf := make([]string, 0, 16*len(idx))
	from, to := make([]int, len(batches)), make([]int, len(batches))
	plain := make([]bool, len(batches))
	some := false
	for _, i := range idx {
		b := &batches[i]
		if pr, ok := b.Policy.Algorithm().(driver.PlainReplayer); ok && b.Policy.Valid() {
			from[i] = len(buf)
			if buf, plain[i] = pr.PlainWrites(buf, b, o, now); !plain[i] {
				buf = buf[:from[i]]
			}
			to[i] = len(buf)
			some = some || plain[i]
		}
	}
	if !some {
		return plainWrites{}, idx
	}
	var scripted map[string]struct{} // keys of batches for the scripts
	for _, i := range idx {
		if !plain[i] {
			if scripted == nil {
				scripted = map[string]struct{}{}
			}
			scripted[batches[i].Key] = struct{}{}
		}
	}
	var p plainWrites
	p.cmds, p.of = make([][]string, 0, 3*len(idx)), make([]int, 0, 3*len(idx))
	rest := make([]int, 0, len(scripted))
	for _, i := range idx {
		n := len(p.cmds)
		_, s := scripted[batches[i].Key]
		if ok := plain[i] && !s && p.add(i, batches[i].Key, buf[from[i]:to[i]:to[i]]); !ok {
			p.cmds, p.of = p.cmds[:n], p.of[:n]
			rest = append(rest, i)
		}
	}
	return p, rest
}

// add adds batch i's commands on key, w in the words of
// driver.AppendFresh, which it turns into commands in place: a command's
// count of words becomes its name, and its name the key. A batch with no
// writes gets one nil command. add reports false for malformed words.
func (p *plainWrites) add(i int, key string, w []string) bool {
	if len(w) == 0 {
		// Nothing in the window: applied as it is.
		p.cmds, p.of = append(p.cmds, nil), append(p.of, i)
		return true
	}
	for q := 0; q < len(w); {
		c, err := strconv.Atoi(w[q])
		if err != nil || c < 1 || q+1+c > len(w) {
			return false
		}
		w[q], w[q+1] = w[q+1], key
		p.cmds, p.of = append(p.cmds, w[q:q+1+c:q+1+c]), append(p.of, i)
		q += 1 + c
	}
	return true
}

// sendPlain runs the plain commands p, records the batches whose commands
// all succeeded, and those whose store did not answer, in errs, and
// returns the others, for the replay script: a batch whose command Redis
// refused. It sets off when most of the batches went to the scripts.
func (r *Reconciler) sendPlain(ctx context.Context, cm driver.Commander, batches []driver.Batch, p plainWrites, errs []error, off *atomic.Bool) (again []int) {
	send := make([][]string, 0, len(p.cmds))
	for _, c := range p.cmds {
		if c != nil {
			send = append(send, c)
		}
	}
	// The deadline grows with the number of batches: 10,000 per
	// CallTimeout.
	n := distinct(p.of)
	var results []error
	if len(send) > 0 {
		ctx, cancel := context.WithTimeout(ctx, r.o.CallTimeout*time.Duration(1+n/10_000))
		results = cm.RunCommands(ctx, send)
		cancel()
	}
	// Each batch's outcome, its commands being consecutive: its first
	// error that Redis did not answer, else whether Redis refused one.
	var se *core.StoreError
	for j, k := 0, 0; j < len(p.of); {
		i := p.of[j]
		var lost error
		refused := false
		for ; j < len(p.of) && p.of[j] == i; j++ {
			if p.cmds[j] == nil {
				continue
			}
			err := results[k]
			k++
			switch {
			case err == nil:
			case errors.As(err, &se) && !se.Answered:
				if lost == nil {
					lost = err
				}
			default:
				refused = true
			}
		}
		switch {
		case lost != nil:
			// Redis did not answer: the scripts would not get through
			// either. The batch stays in the log; sent again, it adds
			// nothing twice.
			errs[i] = check(&batches[i], nil, lost)
		case refused:
			again = append(again, i)
		default:
			errs[i] = nil
		}
	}
	if len(again)*2 > n {
		off.Store(true)
	}
	return again
}

// distinct is the number of runs of equal values in of: the batches of
// plain commands listed batch by batch.
func distinct(of []int) int {
	n, last := 0, -1
	for _, i := range of {
		if i != last {
			n, last = n+1, i
		}
	}
	return n
}
