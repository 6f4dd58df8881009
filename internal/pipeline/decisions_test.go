package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

var (
	fakeMany     = driver.NewScript("fake_many", "-- many", nil)
	fakeDecision = driver.NewDecisionScript("fake", "-- one", nil).WithMany(&driver.Many{Script: fakeMany, Shared: 1, Each: 1})
)

// fakeStore is a store whose single calls of cost 9 block until released
// (the calls in flight that decisions then wait on: inFlight); a call of
// the decision replies its cost as its remaining count, a Many call each
// decision's so, or STALE for a decision with deadline "@1".
type fakeStore struct {
	gate    chan struct{} // the first call waits for it
	mu      sync.Mutex
	calls   [][]string // each call: script name, then args
	badMany bool
}

func (f *fakeStore) one(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	f.mu.Lock()
	f.calls = append(f.calls, append([]string{sc.Name(), keys[0]}, args...))
	f.mu.Unlock()
	if sc != fakeMany && args[1] == "9" {
		<-f.gate
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if sc == fakeMany {
		var out []int64
		for i := 1; i < len(args); i += 2 {
			n, _ := strconv.ParseInt(args[i], 10, 64)
			if args[i+1] == "@1" {
				out = append(out, 1, 0, 0, 0, 0, 0)
			} else {
				out = append(out, 0, 1, n, 0, 0, 7)
			}
		}
		if f.badMany {
			out = out[:len(out)-1]
		}
		return out, nil
	}
	n, _ := strconv.ParseInt(args[1], 10, 64)
	return []int64{1, n, 0, 0, 7}, nil
}

func (f *fakeStore) seen() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func newFake() (*fakeStore, *Decisions) {
	f := &fakeStore{gate: make(chan struct{})}
	return f, &Decisions{One: f.one, Classify: func(name string, err error) error { return fmt.Errorf("%s: %w", name, err) }, StallAfter: time.Hour}
}

// waiting returns how many decisions wait on key.
func (d *Decisions) waiting(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ln := d.lanes[key]; ln != nil {
		return len(ln.waiting)
	}
	return 0
}

// waitFor waits until n decisions wait on key.
func waitFor(t *testing.T, d *Decisions, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); d.waiting(key) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions wait on %s, want %d", d.waiting(key), key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// inFlight starts laneDepth decisions of cost 9 on "hot", which block in
// flight until f.gate is closed, and waits until they are sent.
func inFlight(t *testing.T, f *fakeStore, d *Decisions) []chan outcome {
	t.Helper()
	var chs []chan outcome
	for range laneDepth {
		chs = append(chs, start(context.Background(), d, "hot", "P", "9"))
	}
	for deadline := time.Now().Add(5 * time.Second); len(f.seen()) < laneDepth; {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls sent, want %d", len(f.seen()), laneDepth)
		}
		time.Sleep(time.Millisecond)
	}
	return chs
}

// landAll closes f's gate and waits for the decisions in flight.
func landAll(t *testing.T, f *fakeStore, chs []chan outcome) {
	t.Helper()
	close(f.gate)
	for _, ch := range chs {
		if o := <-ch; o.err != nil || o.reply[1] != 9 {
			t.Fatalf("decision in flight: %v, %v", o.reply, o.err)
		}
	}
}

// blocked is the calls inFlight made.
func blocked() [][]string {
	var c [][]string
	for range laneDepth {
		c = append(c, []string{"fake", "hot", "P", "9"})
	}
	return c
}

type outcome struct {
	reply []int64
	err   error
}

// start runs a decision of cost n on key in a goroutine.
func start(ctx context.Context, d *Decisions, key string, args ...string) chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, err := d.Run(ctx, fakeDecision, []string{key}, args)
		ch <- outcome{r, err}
	}()
	return ch
}

// TestDecisionsCollapse: decisions on a key with a call in flight wait for
// it and then go in one Many call, in the order they came, each getting
// its own reply; a decision on another key meanwhile goes at once.
func TestDecisionsCollapse(t *testing.T) {
	f, d := newFake()
	first := inFlight(t, f, d)
	var waits []chan outcome
	for i := range 4 {
		args := []string{"P", strconv.Itoa(i + 1)}
		if i == 2 {
			args = append(args, "@1") // past its deadline when the call runs
		} else if i == 3 {
			args = append(args, "@99")
		}
		waits = append(waits, start(context.Background(), d, "hot", args...))
		waitFor(t, d, "hot", i+1)
	}
	if r, err := d.Run(context.Background(), fakeDecision, []string{"cold"}, []string{"P", "5"}); err != nil || r[1] != 5 {
		t.Fatalf("a decision on another key: %v, %v; want it decided at once", r, err)
	}
	landAll(t, f, first)
	for i, ch := range waits {
		o := <-ch
		if i == 2 {
			var se *core.StoreError
			if !errors.As(o.err, &se) || se.Reason != "STALE" || se.Class != core.ClassUnavailable {
				t.Errorf("decision past its deadline: %v, want the guard's STALE", o.err)
			}
			continue
		}
		if o.err != nil || len(o.reply) != driver.ReplyLen || o.reply[1] != int64(i+1) || o.reply[4] != 7 {
			t.Errorf("decision %d: %v, %v; want its own reply", i, o.reply, o.err)
		}
	}
	want := append(blocked(),
		[]string{"fake", "cold", "P", "5"},
		[]string{"fake_many", "hot", "P", "1", "", "2", "", "3", "@1", "4", "@99"},
	)
	if got := f.seen(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("calls %q, want %q", got, want)
	}
	if calls, n := d.Batched(); calls != 1 || n != 4 {
		t.Errorf("Batched() = %d, %d; want 1 call of 4", calls, n)
	}
	if len(d.lanes) != 0 {
		t.Errorf("%d keys still in flight", len(d.lanes))
	}
}

// TestDecisionsGiveUp: a decision whose caller gives up while it waits is
// never sent; the one after it goes alone when the call ahead lands.
func TestDecisionsGiveUp(t *testing.T) {
	f, d := newFake()
	first := inFlight(t, f, d)
	ctx, cancel := context.WithCancel(context.Background())
	gone := start(ctx, d, "hot", "P", "2")
	waitFor(t, d, "hot", 1)
	stays := start(context.Background(), d, "hot", "P", "3")
	waitFor(t, d, "hot", 2)
	cancel()
	if o := <-gone; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("given-up decision: %v, want its context's error", o.err)
	}
	landAll(t, f, first)
	if o := <-stays; o.err != nil || o.reply[1] != 3 {
		t.Fatalf("decision after it: %v, %v", o.reply, o.err)
	}
	want := append(blocked(), []string{"fake", "hot", "P", "3"})
	if got := f.seen(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("calls %q, want %q: the given-up decision was sent", got, want)
	}
}

// TestDecisionsMalformed: a Many reply of the wrong length is every
// decision's ErrMalformedReply, never a reply of another's.
func TestDecisionsMalformed(t *testing.T) {
	f, d := newFake()
	f.badMany = true
	first := inFlight(t, f, d)
	a := start(context.Background(), d, "hot", "P", "2")
	waitFor(t, d, "hot", 1)
	b := start(context.Background(), d, "hot", "P", "3")
	waitFor(t, d, "hot", 2)
	landAll(t, f, first)
	for _, ch := range []chan outcome{a, b} {
		if o := <-ch; !errors.Is(o.err, core.ErrMalformedReply) {
			t.Errorf("got %v, %v; want ErrMalformedReply", o.reply, o.err)
		}
	}
}

// TestDecisionsOthersAlone: calls of a script without a Many, or that do
// not fit it, never wait.
func TestDecisionsOthersAlone(t *testing.T) {
	f, d := newFake()
	first := inFlight(t, f, d)
	// One argument too many for the Many: sent at once, beside the first.
	if r, err := d.Run(context.Background(), fakeDecision, []string{"hot"}, []string{"P", "2", "x"}); err != nil || r[1] != 2 {
		t.Fatalf("%v, %v", r, err)
	}
	landAll(t, f, first)
	if n := len(f.seen()); n != laneDepth+1 {
		t.Errorf("%d calls, want %d", n, laneDepth+1)
	}
}

// TestDecisionsStall: decisions that wait StallAfter on a call that does
// not land are sent beside it, together.
func TestDecisionsStall(t *testing.T) {
	f, d := newFake()
	d.StallAfter = 200 * time.Millisecond
	first := inFlight(t, f, d)
	a := start(context.Background(), d, "hot", "P", "2")
	b := start(context.Background(), d, "hot", "P", "3")
	for _, ch := range []chan outcome{a, b} {
		if o := <-ch; o.err != nil {
			t.Fatalf("%v, %v", o.reply, o.err)
		}
	}
	for _, ch := range first {
		select {
		case <-ch:
			t.Fatal("a call in flight landed: it was to stay in flight")
		default:
		}
	}
	landAll(t, f, first)
	if got := f.seen(); len(got) != laneDepth+1 || got[laneDepth][0] != "fake_many" {
		t.Errorf("calls %q, want those in flight and one call of the two behind them", got)
	}
}
