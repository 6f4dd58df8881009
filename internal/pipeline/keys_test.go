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
	keysMany     = driver.NewScript("kfake_many", "-- many", nil)
	keysKeys     = driver.NewScript("kfake_keys", "-- keys", nil)
	keysDecision = driver.NewDecisionScript("kfake", "-- one", nil).WithMany(&driver.Many{Script: keysMany, Shared: 1, Each: 1, Keys: keysKeys})
)

// keysStore is fakeStore for a script with a Keys: single calls of cost 9
// block until gate is closed; a decision's reply is its cost as its
// remaining count; in a Keys call, the decisions on key "bad" fail
// (driver.ManyAlone), and a single call on "bad" is WRONGTYPE.
type keysStore struct {
	gate  chan struct{}
	mu    sync.Mutex
	calls [][]string // each call: script name, its keys joined by ",", then args
}

func (f *keysStore) one(ctx context.Context, sc *driver.Script, keys, args []string) ([]int64, error) {
	f.mu.Lock()
	f.calls = append(f.calls, append([]string{sc.Name(), fmt.Sprint(keys)}, args...))
	f.mu.Unlock()
	if sc == keysDecision && args[1] == "9" {
		<-f.gate
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	decided := func(cost string) []int64 {
		n, _ := strconv.ParseInt(cost, 10, 64)
		return []int64{0, 1, n, 0, 0, 7}
	}
	switch sc {
	case keysKeys:
		var out []int64
		p := 1
		for _, k := range keys {
			n, _ := strconv.Atoi(args[p])
			for i := range n {
				if k == "bad" {
					out = append(out, driver.ManyAlone, 0, 0, 0, 0, 0)
				} else {
					out = append(out, decided(args[p+1+2*i])...)
				}
			}
			p += 1 + 2*n
		}
		return out, nil
	case keysMany:
		var out []int64
		for i := 1; i < len(args); i += 2 {
			out = append(out, decided(args[i])...)
		}
		return out, nil
	}
	if keys[0] == "bad" {
		return nil, driver.Errorf(core.ErrWrongType, "WRONGTYPE")
	}
	return decided(args[1])[1:], nil
}

func (f *keysStore) seen() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// busy returns a store and Decisions of Depth 2 and KeysFrom keysFrom
// with both calls in flight, blocked until the store's gate is closed,
// and their outcomes.
func busy(t *testing.T, keysFrom int) (*keysStore, *Decisions, []chan outcome) {
	t.Helper()
	f := &keysStore{gate: make(chan struct{})}
	d := &Decisions{One: f.one, Classify: func(name string, err error) error { return fmt.Errorf("%s: %w", name, err) }, StallAfter: time.Hour, Depth: 2, KeysFrom: keysFrom}
	var first []chan outcome
	for _, k := range []string{"a", "b"} {
		first = append(first, startKeys(d, k, "9"))
	}
	for deadline := time.Now().Add(5 * time.Second); len(f.seen()) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls sent, want 2", len(f.seen()))
		}
		time.Sleep(time.Millisecond)
	}
	return f, d, first
}

func startKeys(d *Decisions, key, cost string) chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, err := d.Run(context.Background(), keysDecision, []string{key}, []string{"P", cost})
		ch <- outcome{r, err}
	}()
	return ch
}

// queued returns how many decisions wait for a call of several keys.
func (d *Decisions) queued() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.queue)
}

func waitQueued(t *testing.T, d *Decisions, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); d.queued() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions queued, want %d", d.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// queueKeys starts a decision on each of keys in turn, the i-th of cost
// i+1, each queued before the next starts, and returns their outcomes.
func queueKeys(t *testing.T, d *Decisions, keys []string) []chan outcome {
	t.Helper()
	var outs []chan outcome
	for i, k := range keys {
		outs = append(outs, startKeys(d, k, strconv.Itoa(i+1)))
		waitQueued(t, d, i+1)
	}
	return outs
}

// TestDecisionsKeys: with Depth calls in flight, decisions on distinct keys
// wait, and go in one call of the script's Keys when a call lands: by key,
// a key's decisions together in the order they came, each decision given
// its own reply. Decisions on a key that failed in it are sent again
// alone and get their own error.
func TestDecisionsKeys(t *testing.T) {
	f, d, first := busy(t, 1)
	keys := []string{"k1", "k2", "bad", "k2", "k3"}
	outs := queueKeys(t, d, keys)
	close(f.gate)
	for _, ch := range first {
		if o := <-ch; o.err != nil || o.reply[1] != 9 {
			t.Fatalf("call in flight: %v, %v", o.reply, o.err)
		}
	}
	for i, ch := range outs {
		o := <-ch
		if keys[i] == "bad" {
			if !errors.Is(o.err, core.ErrWrongType) {
				t.Errorf("decision on bad: %v, %v; want its own WRONGTYPE", o.reply, o.err)
			}
			continue
		}
		if o.err != nil || len(o.reply) != driver.ReplyLen || o.reply[1] != int64(i+1) {
			t.Errorf("decision %d on %s: %v, %v; want its own reply", i, keys[i], o.reply, o.err)
		}
	}
	got := f.seen()
	wantKeys := []string{"kfake_keys", "[k1 k2 bad k3]", "P", "1", "1", "", "2", "2", "", "4", "", "1", "3", "", "1", "5", ""}
	if len(got) != 4 || !slices.Equal(got[2], wantKeys) || !slices.Equal(got[3], []string{"kfake", "[bad]", "P", "3"}) {
		t.Errorf("calls %q, want the two in flight, %q, then bad's alone", got, wantKeys)
	}
	if calls, n := d.Keyed(); calls != 1 || n != 5 {
		t.Errorf("Keyed() = %d, %d; want 1 call of 5", calls, n)
	}
	if d.inflight != 0 || len(d.lanes) != 0 || d.queued() != 0 {
		t.Errorf("left %d calls in flight, %d lanes, %d queued", d.inflight, len(d.lanes), d.queued())
	}
}

// TestDecisionsKeysCluster: on a cluster a call of several keys holds keys
// of one hash slot; one key's decisions alone go in its Many.
func TestDecisionsKeysCluster(t *testing.T) {
	f, d, first := busy(t, 1)
	d.Cluster = true
	keys := []string{"{x}1", "{y}1", "{x}2", "{z}", "{z}"}
	outs := queueKeys(t, d, keys)
	close(f.gate)
	for _, ch := range append(first, outs...) {
		if o := <-ch; o.err != nil {
			t.Fatalf("%v, %v", o.reply, o.err)
		}
	}
	var calls []string
	for _, c := range f.seen()[2:] {
		calls = append(calls, c[0]+" "+c[1])
	}
	slices.Sort(calls)
	want := []string{"kfake [{y}1]", "kfake_keys [{x}1 {x}2]", "kfake_many [{z}]"}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q", calls, want)
	}
}

// TestDecisionsKeysIdle: with fewer than Depth calls in flight nothing
// waits: every decision is sent alone, at once.
func TestDecisionsKeysIdle(t *testing.T) {
	f := &keysStore{gate: make(chan struct{})}
	d := &Decisions{One: f.one, Classify: func(name string, err error) error { return err }, Depth: 2}
	for i := range 10 {
		r, err := d.Run(context.Background(), keysDecision, []string{"k" + strconv.Itoa(i)}, []string{"P", "1"})
		if err != nil || r[1] != 1 {
			t.Fatalf("%v, %v", r, err)
		}
	}
	if calls, _ := d.Keyed(); calls != 0 || len(f.seen()) != 10 {
		t.Errorf("%d calls of several keys and %d calls, want 0 and 10", calls, len(f.seen()))
	}
}

// TestDecisionsKeysOff: with a negative Depth decisions on distinct keys
// never wait, however many calls are in flight.
func TestDecisionsKeysOff(t *testing.T) {
	f, d, first := busy(t, 1)
	d.Depth = -1
	for i := range 5 {
		r, err := d.Run(context.Background(), keysDecision, []string{"k" + strconv.Itoa(i)}, []string{"P", "1"})
		if err != nil || r[1] != 1 {
			t.Fatalf("%v, %v", r, err)
		}
	}
	close(f.gate)
	for _, ch := range first {
		<-ch
	}
	if calls, _ := d.Keyed(); calls != 0 || len(f.seen()) != 7 {
		t.Errorf("%d calls of several keys and %d calls, want 0 and 7", calls, len(f.seen()))
	}
}

// TestDecisionsKeysFrom: with Depth calls in flight, a decision on
// another key is sent at once while fewer than KeysFrom decisions are in
// the store, its own included, and waits for a call of several keys from
// KeysFrom on.
func TestDecisionsKeysFrom(t *testing.T) {
	f, d, first := busy(t, 4)
	select {
	case o := <-startKeys(d, "k0", "1"):
		if o.err != nil || o.reply[1] != 1 {
			t.Fatalf("third decision in the store: %v, %v", o.reply, o.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("third decision in the store not decided in 5 s (%d queued): want it sent at once", d.queued())
	}
	first = append(first, startKeys(d, "c", "9"))
	for deadline := time.Now().Add(5 * time.Second); len(f.seen()) < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls sent, want 4", len(f.seen()))
		}
		time.Sleep(time.Millisecond)
	}
	if d.queued() != 0 {
		t.Fatalf("%d queued with 3 decisions in the store, want 0", d.queued())
	}
	outs := queueKeys(t, d, []string{"k1", "k2"})
	close(f.gate)
	for _, ch := range first {
		if o := <-ch; o.err != nil || o.reply[1] != 9 {
			t.Fatalf("call in flight: %v, %v", o.reply, o.err)
		}
	}
	for i, ch := range outs {
		if o := <-ch; o.err != nil || o.reply[1] != int64(i+1) {
			t.Fatalf("queued decision %d: %v, %v", i, o.reply, o.err)
		}
	}
	if calls, decisions := d.Keyed(); calls != 1 || decisions != 2 {
		t.Errorf("%d calls of several keys with %d decisions, want 1 with 2", calls, decisions)
	}
}
