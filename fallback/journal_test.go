package fallback

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingcounter"
	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

// deadStore is a Redis that is down.
type deadStore struct{}

func (deadStore) Run(context.Context, *driver.Script, []string, []string) ([]int64, error) {
	return nil, core.ErrStoreUnavailable
}

// jclock is a settable clock.
type jclock struct{ us atomic.Int64 }

func (c *jclock) now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *jclock) advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// degraded returns a Limiter with its breaker open from the start over a
// dead store, journaling to dir; it is closed at the end of the test.
func degraded(t testing.TB, dir string, o Options) *Limiter {
	t.Helper()
	if o.ID == "" {
		o.ID = "j1"
	}
	o.StateDir = dir
	o.Breaker.Start = Open
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l, err := New(deadStore{}, o)
	if err != nil {
		t.Fatal(err)
	}
	l.MarkStarted() // the tests flush the journal themselves
	t.Cleanup(func() { l.Close() })
	return l
}

// units is the cost of the outage log st holds.
func units(st *jstate) (n int64) {
	for _, b := range st.sealed {
		for _, g := range b.Grants {
			n += g.Cost
		}
	}
	for _, k := range st.keys {
		for _, g := range k.open {
			n += g.Cost
		}
	}
	return n
}

// TestJournalTruncatedAnywhere: a journal cut at any byte (a crash while
// writing, a disk that lost the tail) restores every record before the cut:
// the outage log's units of every grant, seal and acknowledgement recorded
// before it, exactly, and reports a torn record when the cut falls inside
// one.
func TestJournalTruncatedAnywhere(t *testing.T) {
	clk := &jclock{}
	clk.us.Store(1_700_000_000_000_000)
	dir := t.TempDir()
	l := degraded(t, dir, Options{ExpectedInstances: 3, Clock: clk.now})
	tb, _ := tokenbucket.Policy("tb", 50, 10)
	sw, _ := slidingwindow.Policy("sw", 50, time.Minute)
	ctx := context.Background()
	// boundary[i] is the file size after flush i; want[i] the units of the
	// log then, counted here, not read back.
	boundaries := []int64{l.jnl.size}
	want := []int64{0}
	var granted, acked int64
	flush := func() {
		t.Helper()
		if err := l.jnl.flush(false); err != nil {
			t.Fatal(err)
		}
		if l.jnl.size != boundaries[len(boundaries)-1] {
			boundaries = append(boundaries, l.jnl.size)
			want = append(want, granted-acked)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 120 {
		clk.advance(time.Duration(rng.IntN(5)+2) * time.Millisecond)
		p := tb
		if i%3 == 0 {
			p = sw
		}
		cost := int64(rng.IntN(3) + 1)
		r, err := l.AllowN(ctx, p, fmt.Sprint("k", rng.IntN(6)), cost)
		if err != nil || !r.Degraded {
			t.Fatalf("%+v %v", r, err)
		}
		if r.Allowed {
			granted += cost
		}
		flush() // one grant record a flush at most, or one acknowledgement
		switch i % 40 {
		case 20: // a replay: seal, and Redis acknowledges half the batches
			batches := l.log.seal()
			errs := make([]error, len(batches))
			for k, b := range batches {
				if k%2 == 1 {
					errs[k] = errors.New("timeout")
					continue
				}
				for _, g := range b.Grants {
					acked += g.Cost
				}
			}
			l.log.ack(batches, errs)
		case 30:
			now := clk.us.Load()
			l.jnl.known(tb, driver.StorageKey(l.o.Prefix, "tb", "k9"), known{seed: driver.Seed{Value: 7, At: now}, at: now})
		}
		flush()
	}
	if granted == 0 || acked == 0 || len(boundaries) < 80 {
		t.Fatalf("granted %d, acked %d, %d flushes: the journal lacks the cases", granted, acked, len(boundaries))
	}
	data, err := os.ReadFile(l.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != boundaries[len(boundaries)-1] {
		t.Fatalf("file %d bytes, last flush ended at %d", len(data), boundaries[len(boundaries)-1])
	}
	// Within flush b+1 the units change at the end of its one grant or
	// acknowledgement record (found from the frames' lengths and types).
	change := make([]int64, len(boundaries))
	for b := 1; b < len(boundaries); b++ {
		change[b] = boundaries[b]
		for o := boundaries[b-1]; o < boundaries[b]; {
			n := int64(binary.LittleEndian.Uint32(data[o:]))
			if typ := data[o+4]; typ == recGrant || typ == recAcked {
				change[b] = o + 8 + n
			}
			o += 8 + n
		}
	}
	b := 0
	for cut := 0; cut <= len(data); cut++ {
		for b+1 < len(boundaries) && boundaries[b+1] <= int64(cut) {
			b++
		}
		expect := want[b]
		if b+1 < len(boundaries) && int64(cut) >= change[b+1] {
			expect = want[b+1]
		}
		st := newJState(1 << 20)
		good, err := readFrames(data[:cut], st.apply)
		if cut < int(boundaries[0]) {
			// Inside the first snapshot: a torn header, nothing to restore.
			if units(st) != 0 || !errors.Is(err, errTorn) && cut > 0 {
				t.Fatalf("cut at %d (inside the header): %d units, err %v", cut, units(st), err)
			}
			continue
		}
		if got := units(st); got != expect {
			t.Fatalf("cut at byte %d of %d: restored %d units, want the %d recorded before it", cut, len(data), got, expect)
		}
		if int64(cut) == boundaries[b] && err != nil {
			t.Fatalf("cut at a record boundary %d: %v", cut, err)
		}
		if err != nil && !errors.Is(err, errTorn) {
			t.Fatalf("cut at %d: %v, want a torn record", cut, err)
		}
		if good > cut || good < int(boundaries[b]) {
			t.Fatalf("cut at %d: read %d bytes, the last flush before the cut ended at %d", cut, good, boundaries[b])
		}
	}
	t.Logf("%d bytes, %d flushes, %d units granted, %d acknowledged: every cut restores exactly what was recorded before it",
		len(data), len(boundaries)-1, granted, acked)
}

// TestJournalDamagedRecord: a flipped byte in the middle stops the read
// there, keeps what came before, and leaves a copy of the file for
// inspection.
func TestJournalDamagedRecord(t *testing.T) {
	dir := t.TempDir()
	l := degraded(t, dir, Options{ExpectedInstances: 2})
	p, _ := slidingwindow.Policy("sw", 100, time.Minute)
	for i := range 10 {
		if r, _ := l.Allow(context.Background(), p, "k"); !r.Allowed {
			t.Fatalf("request %d denied", i)
		}
		if err := l.jnl.flush(false); err != nil {
			t.Fatal(err)
		}
	}
	l.Crash()
	path := filepath.Join(dir, "holdfast-j1.journal")
	data, _ := os.ReadFile(path)
	data[len(data)-30] ^= 0xff // inside the last grant
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	again := degraded(t, dir, Options{})
	r := again.jnl.restored
	if r.cost != 9 || r.dropped == 0 || r.instances != 2 {
		t.Fatalf("restored %+v, want the 9 grants before the damaged one and 2 instances", r)
	}
	if _, err := os.Stat(path + ".damaged"); err != nil {
		t.Fatalf("no copy of the damaged journal: %v", err)
	}
}

// TestJournalContinuesLease: an instance restarted during an outage, after
// Close or a crash (once its grants were flushed), divides by the instance
// count it knew, not ExpectedInstances, and goes on with each key's lease
// instead of a fresh share: a token bucket of 20 over 4 instances admits 5
// in all, a sliding window of 20 too.
func TestJournalContinuesLease(t *testing.T) {
	tb, _ := tokenbucket.Policy("tb", 20, 0.001)
	sw, _ := slidingwindow.Policy("sw", 20, time.Hour)
	for _, p := range []core.Policy{tb, sw} {
		for _, crash := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/crash=%v", p.Algorithm().Name(), crash), func(t *testing.T) {
				dir := t.TempDir()
				ctx := context.Background()
				first := degraded(t, dir, Options{ExpectedInstances: 4, StateFlush: 10 * time.Millisecond})
				if err := first.Start(ctx); err != nil {
					t.Fatal(err)
				}
				admit := func(l *Limiter) (n int) {
					for range 3 {
						r, err := l.Allow(ctx, p, "k")
						if err != nil || !r.Degraded {
							t.Fatalf("%+v %v", r, err)
						}
						if r.Allowed {
							n++
						}
					}
					return n
				}
				got := admit(first)
				if got != 3 {
					t.Fatalf("first instance admitted %d of its share of 5 before the restart, want 3", got)
				}
				if crash {
					time.Sleep(50 * time.Millisecond) // a few flushes
					first.Crash()
				} else if err := first.Close(); err != nil {
					t.Fatal(err)
				}
				second := degraded(t, dir, Options{}) // ExpectedInstances 1
				if err := second.Start(ctx); err != nil {
					t.Fatal(err)
				}
				if n := second.Status().Instances; n != 4 {
					t.Fatalf("restarted instance counts %d instances, want the 4 it knew", n)
				}
				if r := RestoredFromJournal(second); r.Units != 3 || r.Keys != 1 {
					t.Fatalf("restored %+v, want 3 units and the key's lease", r)
				}
				if got := admit(second); got != 2 {
					t.Fatalf("restarted instance admitted %d more, want the 2 left of its share of 5 (a fresh quota would give 20)", got)
				}
				if pending := second.Status().PendingLog; pending == 0 {
					t.Fatal("the restored grants are not in the outage log")
				}
			})
		}
	}
}

// TestJournalLeaseMatchesLive: a lease rebuilt from the journal decides
// exactly as the live one it mirrors, over a random run of the three
// algorithms on several keys (grants at least a millisecond apart, so none
// coalesce; coalesced grants may only leave it stricter, checked at the
// end).
func TestJournalLeaseMatchesLive(t *testing.T) {
	clk := &jclock{}
	clk.us.Store(1_700_000_000_000_000)
	tb, _ := tokenbucket.Policy("tb", 12, 4)
	sw, _ := slidingwindow.Policy("sw", 12, 3*time.Second)
	sc, _ := slidingcounter.Policy("sc", 12, 3*time.Second)
	ctx := context.Background()
	dir := t.TempDir()
	live := degraded(t, dir, Options{ExpectedInstances: 3, Clock: clk.now})
	rng := rand.New(rand.NewPCG(3, 4))
	pick := func() (core.Policy, string, int64) {
		p := []core.Policy{tb, sw, sc}[rng.IntN(3)]
		return p, fmt.Sprint("k", rng.IntN(4)), int64(rng.IntN(2) + 1)
	}
	for range 400 {
		clk.advance(time.Duration(rng.IntN(150)+1) * time.Millisecond)
		p, k, c := pick()
		if _, err := live.AllowN(ctx, p, k, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := live.jnl.flush(false); err != nil {
		t.Fatal(err)
	}
	// A copy of the journal as a crash leaves it, opened elsewhere.
	data, err := os.ReadFile(live.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir2, "holdfast-j1.journal"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	restored := degraded(t, dir2, Options{Clock: clk.now})
	if n := restored.Status().Instances; n != 3 {
		t.Fatalf("restored instance count %d, want 3", n)
	}
	for i := range 400 {
		clk.advance(time.Duration(rng.IntN(150)+1) * time.Millisecond)
		p, k, c := pick()
		a, err1 := live.AllowN(ctx, p, k, c)
		b, err2 := restored.AllowN(ctx, p, k, c)
		if err1 != nil || err2 != nil || a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.RetryAfter != b.RetryAfter {
			t.Fatalf("decision %d on %s %s: live %+v %v, restored %+v %v", i, p.Name(), k, a, err1, b, err2)
		}
	}
	// Coalesced grants: a burst within a millisecond is one record; the
	// rebuilt lease admits no more than the live one afterwards.
	for range 6 {
		if _, err := live.AllowN(ctx, tb, "burst", 1); err != nil {
			t.Fatal(err)
		}
		clk.advance(100 * time.Microsecond)
	}
	if err := live.jnl.flush(false); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(live.journalPath())
	dir3 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir3, "holdfast-j1.journal"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	third := degraded(t, dir3, Options{Clock: clk.now})
	var nl, nr int
	for range 50 {
		clk.advance(50 * time.Millisecond)
		if r, _ := live.Allow(ctx, tb, "burst"); r.Allowed {
			nl++
		}
		if r, _ := third.Allow(ctx, tb, "burst"); r.Allowed {
			nr++
		}
	}
	if nr > nl || nr < nl-1 {
		t.Fatalf("after a coalesced burst the rebuilt lease admitted %d, the live one %d", nr, nl)
	}
}

// TestJournalCompacts: once the outage log is replayed, the journal is
// rewritten as a small snapshot that still holds the instance count and
// the leases; a file growing in a long outage is rewritten too.
func TestJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	l := degraded(t, dir, Options{ExpectedInstances: 4})
	p, _ := tokenbucket.Policy("tb", 1_000_000_000, 1_000_000)
	ctx := context.Background()
	for i := range 20_000 {
		if r, _ := l.Allow(ctx, p, fmt.Sprint("k", i%50)); !r.Allowed {
			t.Fatal("denied")
		}
	}
	if err := l.jnl.flush(false); err != nil {
		t.Fatal(err)
	}
	big := l.jnl.size
	batches := l.log.seal()
	l.log.ack(batches, make([]error, len(batches)))
	for range 2 { // the acks, then the compaction they allow
		if err := l.jnl.flush(false); err != nil {
			t.Fatal(err)
		}
	}
	if l.jnl.size >= big/10 || l.jnl.st.pending() != 0 {
		t.Fatalf("journal %d bytes after the replay (%d before), %d pending: not compacted", l.jnl.size, big, l.jnl.st.pending())
	}
	small := l.jnl.size
	l.Crash()
	again := degraded(t, dir, Options{})
	if r := again.jnl.restored; r.keys != 50 || r.instances != 4 || r.cost != 0 {
		t.Fatalf("restored %+v, want the 50 leases, 4 instances and no grants", r)
	}
	t.Logf("20000 grants: %d bytes; after the replay %d bytes", big, small)

	// Growth: a long outage's file is rewritten once it passes 4 MiB (and
	// four times its last snapshot).
	before := again.jnl.compactions
	for i := range 200_000 {
		if r, _ := again.Allow(ctx, p, fmt.Sprint("k", i%5000)); !r.Allowed {
			t.Fatal("denied")
		}
		if i%10_000 == 0 {
			if err := again.jnl.flush(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := again.jnl.flush(false); err != nil {
		t.Fatal(err)
	}
	if again.jnl.compactions == before || again.jnl.size > max(compactBytes, 4*again.jnl.snapSize)+kickBytes {
		t.Fatalf("journal %d bytes, last snapshot %d, %d compactions: not rewritten as it grew",
			again.jnl.size, again.jnl.snapSize, again.jnl.compactions-before)
	}
	t.Logf("200000 more grants: %d bytes written, the file %d bytes after %d compactions",
		again.jnl.written, again.jnl.size, again.jnl.compactions-before)
}

// TestJournalReadsOldStateFile: an outage log saved as JSON by an earlier
// holdfast is read back with its batch ids, then kept in the journal.
func TestJournalReadsOldStateFile(t *testing.T) {
	dir := t.TempDir()
	old := []savedBatch{{ID: "j1:abcd1234:7", Key: "hf:{tb:k}", Policy: "tb", Algorithm: tokenbucket.Name, Limit: 10, IntervalUS: 100_000,
		Grants: []driver.Grant{{Cost: 2, At: 1_700_000_000_000_000}, {Cost: 1, At: 1_700_000_000_100_000}}}}
	data, _ := json.Marshal(old)
	legacy := filepath.Join(dir, "holdfast-j1.outage-log.json")
	if err := os.WriteFile(legacy, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l := degraded(t, dir, Options{})
	if n := l.log.pending(); n != 2 {
		t.Fatalf("pending %d, want the 2 saved grants", n)
	}
	if b := l.log.seal(); len(b) != 1 || b[0].ID != "j1:abcd1234:7" {
		t.Fatalf("batches %+v, want the saved batch with its id", b)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old state file still there (%v)", err)
	}
	if n, err := JournalPending(dir, "j1"); err != nil || n != 2 {
		t.Fatalf("journal holds %d (%v), want the 2 grants", n, err)
	}
}

// BenchmarkJournalAppend is the request path's cost of journaling a grant:
// the append to the buffer under the journal's lock (the flusher, which
// writes the buffer out, is measured by BenchmarkJournalFlush).
func BenchmarkJournalAppend(b *testing.B) {
	for _, bc := range journalBenchCases() {
		b.Run(bc.name, func(b *testing.B) {
			l := degraded(b, b.TempDir(), Options{})
			seed := driver.Seed{Value: 5_000_000, At: 1_700_000_000_000_000}
			at := clockMicros()
			i := 0
			for b.Loop() {
				l.jnl.grant(grantLogged|grantLeased, bc.p, bc.keys[i%len(bc.keys)], seed, bc.ids[i%len(bc.ids)], 1, at+int64(i>>4), 4)
				if i++; i%(1<<16) == 0 {
					b.StopTimer()
					l.jnl.mu.Lock()
					l.jnl.enc.buf, l.jnl.coal.off = l.jnl.enc.buf[:0], -1 // as a flush leaves it
					l.jnl.mu.Unlock()
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkJournalFlush is the flusher's cost per grant, off the request
// path: reading the records back into its mirror, writing them and one
// fsync per 10000 grants (one StateFlush at 100000 grants a second), and
// the bytes written per grant, compactions included.
func BenchmarkJournalFlush(b *testing.B) {
	for _, bc := range journalBenchCases() {
		b.Run(bc.name, func(b *testing.B) {
			l := degraded(b, b.TempDir(), Options{})
			seed := driver.Seed{Value: 5_000_000, At: 1_700_000_000_000_000}
			at := clockMicros()
			i := 0
			for b.Loop() {
				b.StopTimer()
				for range 10_000 {
					l.jnl.grant(grantLogged|grantLeased, bc.p, bc.keys[i%len(bc.keys)], seed, bc.ids[i%len(bc.ids)], 1, at+int64(i>>4), 4)
					i++
				}
				b.StartTimer()
				if err := l.jnl.flush(false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/grant")
			b.ReportMetric(float64(l.jnl.written)/float64(i), "B/grant")
		})
	}
}

type journalBench struct {
	name      string
	p         core.Policy
	keys, ids []string
}

// journalBenchCases: a hot token bucket key (grants 16 a microsecond:
// they coalesce), 100k token bucket keys, 100k sliding window keys (each
// grant with its request id).
func journalBenchCases() []journalBench {
	tb, _ := tokenbucket.Policy("bench", 1_000_000, 1_000)
	sw, _ := slidingwindow.Policy("benchsw", 1_000_000, time.Minute)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = driver.NewRequestID()
	}
	return []journalBench{
		{"token_bucket_hot_key", tb, keys[:1], []string{""}},
		{"token_bucket_100k_keys", tb, keys, []string{""}},
		{"sliding_window_100k_keys", sw, keys, ids},
	}
}

func clockMicros() int64 { return time.Now().UnixMicro() }

// TestJournalKeepsReplayedGrants: the grants a replay applied, recorded for
// a restore after a later data loss, are read back with their replay's
// time, and a snapshot of the state keeps them (after the key's lease
// record, which replaces its state).
func TestJournalKeepsReplayedGrants(t *testing.T) {
	p, _ := tokenbucket.Policy("jr", 10, 1)
	const skey = "hf:{jr:k}"
	grants := []driver.Grant{{ID: "a", Cost: 2, At: 100}, {ID: "b", Cost: 3, At: 200}}
	var e jenc
	e.header()
	e.replayed(e.policy(p), skey, 300, grants)
	fillCRC(e.buf)
	check := func(what string, st *jstate) {
		t.Helper()
		k := st.keys[skey]
		if k == nil || k.ks.replayed == nil || k.ks.replayed.to != 300 || fmt.Sprint(k.ks.replayed.grants) != fmt.Sprint(grants) {
			t.Fatalf("%s: key %+v, want the replayed grants %v at 300", what, k, grants)
		}
	}
	st := newJState(1000)
	if _, err := readFrames(e.buf, st.apply); err != nil {
		t.Fatal(err)
	}
	check("appended", st)
	st.keys[skey].ks.known = known{seed: driver.Seed{Value: 1, At: 50}, at: 50} // a lease record too
	var snap jenc
	st.snapshot(&snap)
	fillCRC(snap.buf)
	again := newJState(1000)
	if _, err := readFrames(snap.buf, again.apply); err != nil {
		t.Fatal(err)
	}
	check("snapshot", again)
	if again.keys[skey].ks.known.at != 50 {
		t.Fatalf("snapshot lost the known state: %+v", again.keys[skey].ks.known)
	}
}
