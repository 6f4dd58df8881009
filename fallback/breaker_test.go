package fallback

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var errBoom = errors.New("boom")

// hang bounds every wait on the code under test, so a bug fails the test
// instead of stalling it. No assertion depends on it.
const hang = 5 * time.Second

// fakeClock is a settable BreakerOptions.Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// timer is one call to the fake After: the test reads it and fires it.
type timer struct {
	d time.Duration
	c chan time.Time
}

// harness runs a breaker whose probe loop is driven step by step: the test
// fires its timers and answers its probes and reconciles.
type harness struct {
	t          *testing.T
	b          *Breaker
	clock      *fakeClock
	timers     chan timer
	probes     chan answer // the next probe's answer
	reconciles chan error  // the next reconcile's answer
	changes    chan stateChange
	pending    *timer // a timer awaited but not yet fired
	marked     uint64
}

// answer is what the next probe does: advance the clock by took, return err.
type answer struct {
	err  error
	took time.Duration
}

func newHarness(t *testing.T, o BreakerOptions, withReconcile bool) *harness {
	t.Helper()
	h := &harness{
		t: t, clock: &fakeClock{t: time.Unix(1e9, 0)},
		timers: make(chan timer, 16), changes: make(chan stateChange, 64),
		probes: make(chan answer), reconciles: make(chan error),
	}
	o.Clock, o.After, o.Seed = h.clock.Now, h.after, 1
	o.Probe = func(ctx context.Context) error {
		select {
		case a := <-h.probes:
			h.clock.Add(a.took)
			return a.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if withReconcile {
		o.Reconcile = func(ctx context.Context) error {
			select {
			case err := <-h.reconciles:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	o.OnStateChange = func(from, to State) {
		if got := h.b.State(); got != to { // would deadlock if called under the lock
			t.Errorf("OnStateChange(%v, %v): State() = %v", from, to, got)
		}
		h.changes <- stateChange{from, to}
	}
	b, err := NewBreaker(o)
	if err != nil {
		t.Fatal(err)
	}
	h.b = b
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.StartProbing(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); h.waitStopped() })
	return h
}

func (h *harness) after(d time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	h.timers <- timer{d, c}
	return c
}

func (h *harness) waitStopped() {
	h.t.Helper()
	select {
	case <-h.b.stopped:
	case <-time.After(hang):
		h.t.Fatal("probe loop did not exit")
	}
}

// await waits for the loop's next timer and checks its duration is in
// [lo, hi); the timer stays pending for fire.
func (h *harness) await(lo, hi time.Duration) {
	h.t.Helper()
	if h.pending == nil {
		select {
		case tm := <-h.timers:
			h.pending = &tm
		case <-time.After(hang):
			h.t.Fatal("probe loop set no timer")
		}
	}
	if d := h.pending.d; d < lo || d >= hi {
		h.t.Fatalf("timer of %v, want [%v, %v)", d, lo, hi)
	}
}

// fire awaits the loop's next timer and fires it.
func (h *harness) fire(lo, hi time.Duration) {
	h.t.Helper()
	h.await(lo, hi)
	h.pending.c <- time.Time{}
	h.pending = nil
}

func send[T any](h *harness, c chan T, v T, what string) {
	h.t.Helper()
	select {
	case c <- v:
	case <-time.After(hang):
		h.t.Fatalf("no %s was run", what)
	}
}

// take returns the n changes a step should have caused.
func (h *harness) take(n int) []State {
	h.t.Helper()
	var got []State
	for range n {
		select {
		case c := <-h.changes:
			got = append(got, c.to)
		case <-time.After(hang):
			h.t.Fatalf("got changes %v, want %d", got, n)
		}
	}
	return got
}

// Steps of the transition table.
func call(err error, took time.Duration) func(*harness) {
	return func(h *harness) { g, _ := h.b.Allow(); h.b.Done(g, err, took) }
}

var (
	ok      = call(nil, time.Millisecond)
	fail    = call(errBoom, time.Millisecond)
	slow    = call(nil, 40*time.Millisecond) // the default SlowCall
	brisk   = call(nil, 40*time.Millisecond-1)
	trip    = func(h *harness) { h.b.Trip(errBoom) }
	mark    = func(h *harness) { h.marked = h.b.Generation() }
	stale   = func(h *harness) { h.b.Done(h.marked, errBoom, 0) }
	badProb = probe(errBoom, 0, false, nil)
	slowPrb = probe(nil, 40*time.Millisecond, false, nil)
	heal    = probe(nil, 0, true, nil)
	badRec  = probe(nil, 0, true, errBoom)
)

// probe fires the probe timer and answers the probe with err after advancing
// the clock by took; if healthy, it answers the reconcile (when there is one)
// with rec and, if that succeeds, fires the jitter timer.
func probe(err error, took time.Duration, healthy bool, rec error) func(*harness) {
	return func(h *harness) {
		h.fire(time.Second, time.Second+1)
		send(h, h.probes, answer{err, took}, "probe")
		if !healthy {
			h.await(time.Second, time.Second+1) // the next interval: the probe is done
			return
		}
		if h.b.opt.Reconcile != nil {
			send(h, h.reconciles, rec, "reconcile")
		}
		if rec == nil {
			h.fire(0, 100*time.Millisecond)
		}
	}
}

type step struct {
	do   func(*harness)
	want []State // the states entered, in order
}

func TestTransitions(t *testing.T) {
	tests := []struct {
		name      string
		opt       BreakerOptions
		reconcile bool
		steps     []step
		final     State
	}{
		{"K failures open", BreakerOptions{}, false, []step{{fail, nil}, {fail, nil}, {fail, []State{Open}}}, Open},
		{"Failures option", BreakerOptions{Failures: 1}, false, []step{{fail, []State{Open}}}, Open},
		{"success resets the count", BreakerOptions{}, false, []step{
			{fail, nil}, {fail, nil}, {ok, nil}, {fail, nil}, {fail, nil}, {fail, []State{Open}}}, Open},
		{"slow calls count", BreakerOptions{}, false, []step{{slow, nil}, {slow, nil}, {slow, []State{Open}}}, Open},
		{"calls under SlowCall succeed", BreakerOptions{}, false, []step{
			{fail, nil}, {fail, nil}, {brisk, nil}, {fail, nil}, {fail, nil}}, Closed},
		{"trip", BreakerOptions{}, false, []step{{trip, []State{Open}}, {trip, nil}}, Open},
		{"results while open dropped", BreakerOptions{Failures: 1}, false, []step{
			{trip, []State{Open}}, {fail, nil}, {ok, nil}}, Open},
		{"probe failure stays open", BreakerOptions{}, false, []step{
			{trip, []State{Open}}, {badProb, nil}, {badProb, nil}}, Open},
		{"slow probe stays open", BreakerOptions{}, false, []step{{trip, []State{Open}}, {slowPrb, nil}}, Open},
		{"probe success closes", BreakerOptions{}, true, []step{
			{trip, []State{Open}}, {badProb, nil}, {heal, []State{Reconciling, Closed}}}, Closed},
		{"nil Reconcile closes", BreakerOptions{}, false, []step{
			{trip, []State{Open}}, {heal, []State{Reconciling, Closed}}}, Closed},
		{"reconcile error reopens", BreakerOptions{}, true, []step{
			{trip, []State{Open}}, {badRec, []State{Reconciling, Open}},
			{heal, []State{Reconciling, Closed}}}, Closed},
		{"start open", BreakerOptions{Start: Open}, true, []step{
			{fail, nil}, {heal, []State{Reconciling, Closed}}, {fail, nil}}, Closed},
		{"stale generation dropped", BreakerOptions{}, false, []step{
			{mark, nil}, {trip, []State{Open}}, {heal, []State{Reconciling, Closed}},
			{stale, nil}, {stale, nil}, {stale, nil}}, Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opt, tt.reconcile)
			if got := h.b.State(); got != tt.opt.Start {
				t.Fatalf("initial state %v, want %v", got, tt.opt.Start)
			}
			for i, s := range tt.steps {
				s.do(h)
				if got := h.take(len(s.want)); fmt.Sprint(got) != fmt.Sprint(s.want) {
					t.Fatalf("step %d: entered %v, want %v", i, got, s.want)
				}
				select {
				case c := <-h.changes:
					t.Fatalf("step %d: unexpected change %v -> %v", i, c.from, c.to)
				default:
				}
			}
			if got := h.b.State(); got != tt.final {
				t.Errorf("final state %v, want %v", got, tt.final)
			}
		})
	}
}

func TestTripDuringReconcileWins(t *testing.T) {
	h := newHarness(t, BreakerOptions{}, true)
	trip(h)
	h.fire(time.Second, time.Second+1)
	send(h, h.probes, answer{}, "probe")
	h.take(2) // Open, Reconciling
	h.b.Trip(errBoom)
	send(h, h.reconciles, nil, "reconcile") // succeeds, but too late
	if got := h.take(1); got[0] != Open {
		t.Fatalf("entered %v, want open", got)
	}
	h.await(time.Second, time.Second+1) // back to probing: no jitter timer was set
	if got := h.b.State(); got != Open {
		t.Fatalf("state %v, want open", got)
	}
	want := Counts{Transitions: 3, Probes: 1, Reconciles: 1}
	if got := h.b.Counts(); got != want {
		t.Errorf("Counts() = %+v, want %+v", got, want)
	}
	if !errors.Is(h.b.Cause(), errBoom) {
		t.Errorf("Cause() = %v, want boom", h.b.Cause())
	}
}

func TestOnStateChangeMayCallBreaker(t *testing.T) {
	var got []string
	var b *Breaker
	b, err := NewBreaker(BreakerOptions{Failures: 1, OnStateChange: func(from, to State) {
		b.Trip(nil) // re-entrant: no change (already open), no deadlock
		c := b.Counts()
		got = append(got, fmt.Sprintf("%v>%v@%d", from, to, c.Transitions))
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { g, _ := b.Allow(); b.Done(g, errBoom, 0); close(done) }()
	select {
	case <-done:
	case <-time.After(hang):
		t.Fatal("OnStateChange deadlocked")
	}
	if fmt.Sprint(got) != "[closed>open@1]" {
		t.Errorf("changes %v", got)
	}
}

func TestPanickingOnStateChangeDoesNotWedge(t *testing.T) {
	var got []State
	b, err := NewBreaker(BreakerOptions{Failures: 1, OnStateChange: func(from, to State) {
		got = append(got, to)
		if len(got) == 1 {
			panic("callback bug")
		}
	}, Start: Open})
	if err != nil {
		t.Fatal(err)
	}
	gen := b.Generation()
	func() {
		defer func() { _ = recover() }()
		b.moveIf(gen, Reconciling, nil)
	}()
	b.moveIf(gen+1, Closed, nil)
	if fmt.Sprint(got) != "[reconciling closed]" {
		t.Errorf("delivered %v, want [reconciling closed]", got)
	}
}

func TestSlowCallCause(t *testing.T) {
	b, err := NewBreaker(BreakerOptions{Failures: 1, CallTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := b.Allow()
	b.Done(g, nil, 79*time.Millisecond)
	if b.State() != Closed {
		t.Fatal("79ms opened a breaker with SlowCall 80ms")
	}
	b.Done(g, nil, 80*time.Millisecond)
	if !errors.Is(b.Cause(), ErrSlowCall) || b.State() != Open {
		t.Errorf("state %v, cause %v; want open, slow call", b.State(), b.Cause())
	}
}

func TestNewBreakerOptions(t *testing.T) {
	b, err := NewBreaker(BreakerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o := b.opt
	if o.Failures != 3 || o.CallTimeout != 50*time.Millisecond || o.SlowCall != 40*time.Millisecond ||
		o.ProbeInterval != time.Second || o.Jitter != 100*time.Millisecond || b.CallTimeout() != o.CallTimeout {
		t.Errorf("defaults %+v", o)
	}
	bad := map[string]BreakerOptions{
		"Failures": {Failures: -1}, "CallTimeout": {CallTimeout: -1}, "SlowCall": {SlowCall: -1},
		"ProbeInterval": {ProbeInterval: -1}, "Jitter": {Jitter: -1},
		"Start reconciling": {Start: Reconciling}, "Start 7": {Start: 7},
	}
	for name, o := range bad {
		if _, err := NewBreaker(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: err = %v, want ErrInvalidOptions", name, err)
		}
	}
	if err := b.StartProbing(context.Background()); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("StartProbing without Probe: %v", err)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", Open: "open", Reconciling: "reconciling", 9: "State(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
}

func TestProbingStops(t *testing.T) {
	tests := []struct {
		name  string
		start State
		setup func(*harness)
	}{
		{"idle while closed", Closed, func(*harness) {}},
		{"waiting for the interval", Open, func(h *harness) { h.await(time.Second, time.Second+1) }},
		{"inside a probe", Open, func(h *harness) { h.fire(time.Second, time.Second+1) }},
		{"inside a reconcile", Open, func(h *harness) {
			h.fire(time.Second, time.Second+1)
			send(h, h.probes, answer{}, "probe")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, BreakerOptions{Start: tt.start}, true)
			tt.setup(h)
			h.b.Close()
			h.waitStopped()
			if err := h.b.StartProbing(context.Background()); err == nil {
				t.Error("StartProbing after Close succeeded")
			}
			if s := h.b.State(); s == Reconciling {
				t.Error("a stopped recovery left the breaker reconciling")
			}
		})
	}
	t.Run("ctx cancelled", func(t *testing.T) {
		b, _ := NewBreaker(BreakerOptions{Probe: func(context.Context) error { return nil }})
		ctx, cancel := context.WithCancel(context.Background())
		if err := b.StartProbing(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case <-b.stopped:
		case <-time.After(hang):
			t.Fatal("probe loop did not exit after cancel")
		}
		b.Close() // after the loop exited: returns at once
	})
}

// TestConcurrent runs 16 callers against a breaker whose probe loop spins with
// instant timers, then checks the reported transitions form one legal chain.
func TestConcurrent(t *testing.T) {
	var (
		mu       sync.Mutex
		changes  []stateChange
		inside   atomic.Int32
		reconN   atomic.Int64
		instant  = func(time.Duration) <-chan time.Time { c := make(chan time.Time, 1); c <- time.Time{}; return c }
		ctx, end = context.WithCancel(context.Background())
	)
	defer end()
	b, err := NewBreaker(BreakerOptions{
		After: instant, Seed: 7, Jitter: time.Nanosecond,
		Probe: func(context.Context) error { return nil },
		Reconcile: func(context.Context) error {
			if reconN.Add(1)%3 == 0 {
				return errBoom
			}
			return nil
		},
		OnStateChange: func(from, to State) {
			if inside.Add(1) != 1 {
				t.Error("OnStateChange calls overlap")
			}
			mu.Lock()
			changes = append(changes, stateChange{from, to})
			mu.Unlock()
			inside.Add(-1)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StartProbing(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				g, ok := b.Allow()
				switch {
				case !ok:
					runtime.Gosched() // let the probe loop recover
				case i%500 == w:
					b.Trip(nil)
				case ok:
					var err error
					if (i+w)%5 == 0 {
						err = errBoom
					}
					b.Done(g, err, time.Duration(i%50)*time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	b.Close()
	checkChain(t, changes, b)
}

func checkChain(t *testing.T, changes []stateChange, b *Breaker) {
	t.Helper()
	legal := map[stateChange]bool{{Closed, Open}: true, {Open, Reconciling}: true,
		{Reconciling, Closed}: true, {Reconciling, Open}: true}
	at, closes := Closed, uint64(0)
	for i, c := range changes {
		if c.from != at || !legal[c] {
			t.Fatalf("change %d: %v -> %v while %v", i, c.from, c.to, at)
		}
		at = c.to
		if c.to == Closed {
			closes++
		}
	}
	n := b.Counts()
	if uint64(len(changes)) != n.Transitions || n.Transitions != b.Generation() || at != b.State() {
		t.Errorf("%d changes reported, Counts %+v, generation %d, state %v (chain ends %v)",
			len(changes), n, b.Generation(), b.State(), at)
	}
	if n.Reconciles < closes || n.Probes < closes {
		t.Errorf("Counts %+v for %d closes", n, closes)
	}
	t.Logf("%d transitions, %+v", len(changes), n)
}

func BenchmarkAllowDone(b *testing.B) {
	br, _ := NewBreaker(BreakerOptions{})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g, ok := br.Allow()
			if ok {
				br.Done(g, nil, time.Millisecond)
			}
		}
	})
}

func ExampleBreaker() {
	b, _ := NewBreaker(BreakerOptions{Failures: 2, OnStateChange: func(from, to State) {
		fmt.Println(from, "->", to)
	}})
	for range 2 {
		if gen, ok := b.Allow(); ok {
			b.Done(gen, errors.New("i/o timeout"), b.CallTimeout())
		}
	}
	_, ok := b.Allow()
	fmt.Println("may call redis:", ok, "cause:", b.Cause())
	// Output:
	// closed -> open
	// may call redis: false cause: i/o timeout
}
