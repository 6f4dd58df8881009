package fallback

import (
	"errors"
	"os"
	"path/filepath"
)

// Crash stops l as a SIGKILL would: nothing more reaches its journal (the
// records not yet flushed are lost, as a killed process's buffer is), its
// goroutines end, and Close afterwards writes nothing.
func (l *Limiter) Crash() {
	if set := l.shards.Load(); set != nil {
		for _, c := range set.cells {
			c.crash()
		}
	}
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	l.cell.crash()
	if l.stateLock != nil {
		l.stateLock.Close() // a killed process's locks go with it
	}
}

func (c *cell) crash() {
	c.jnl.abandon()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	c.breaker.Close()
	c.leases.Close()
}

// Restored is what New read back from the state dir.
type Restored struct {
	SealedBatches, OpenGrants int
	Units                     int64 // cost of the restored grants
	Keys                      int   // keys given a known state or lease
	Instances                 int64
	DroppedBytes              int // a torn or damaged tail not read
}

// RestoredFromJournal reports what New read back from l's journal.
func RestoredFromJournal(l *Limiter) Restored {
	if l.jnl == nil {
		return Restored{}
	}
	r := l.jnl.restored
	return Restored{r.sealed, r.open, r.cost, r.keys, r.instances, r.dropped}
}

// JournalPending reads the journal of instance id in dir as New would and
// returns the outage log grant entries it holds.
func JournalPending(dir, id string) (int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "holdfast-"+id+".journal"))
	if err != nil {
		return 0, err
	}
	st := newJState(1 << 20)
	if _, err := readFrames(data, st.apply); err != nil && !errors.Is(err, errTorn) {
		return 0, err // a torn tail is a write in progress
	}
	return st.pending(), nil
}

// MarkStarted lets tests decide on l without its background work (no
// probe, heartbeat or journal flusher); Start may follow.
func (l *Limiter) MarkStarted() { l.life.CompareAndSwap(0, 3) }

// AbandonJournal stops l's journal as a SIGKILL would, at once: the
// records not yet flushed are lost, and nothing more is written. l goes
// on; Crash it after.
func (l *Limiter) AbandonJournal() { l.cell.jnl.abandon() }

// BarrierPoll is how often an instance at the recovery barrier reads it.
const BarrierPoll = barrierPoll
