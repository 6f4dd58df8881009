package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
	"github.com/holdfast/holdfast/reconcile"
)

// window reads a window key: its members and scores, in order.
func window(t *testing.T, srv *redistest.Server, key string) string {
	t.Helper()
	return srv.Do(t, "ZRANGE", key, "0", "-1", "WITHSCORES")
}

// expiry is a key's PEXPIRETIME (ms; -1 without a TTL, -2 without the
// key).
func expiry(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	ms, err := strconv.ParseInt(srv.Do(t, "PEXPIRETIME", key), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// plainCase is a replay of n window batches without seed units, half onto
// keys a decision left (a member at now and the window's TTL, or an old
// member and a TTL about to end), half onto missing keys, and the same
// replay onto keys of its own through the replay scripts alone.
type plainCase struct {
	srv            *redistest.Server
	store          driver.Store
	plain, scripts []driver.Batch
	width          int64 // ms
}

func newPlainCase(t *testing.T, n int) *plainCase {
	t.Helper()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := slidingwindow.Policy("psw", 100, time.Minute)
	now := redisNow(t, srv)
	c := &plainCase{srv: srv, store: store, width: p.Interval().Milliseconds()}
	var setup [][]string
	for _, way := range []string{"p:", "s:"} {
		bs := reconcileBatches(p, way, n, now)
		for i := range bs {
			bs[i].Key = way + bs[i].Key
			switch i % 4 {
			case 0: // a decision just now: its key lives a window
				setup = append(setup, []string{"ZADD", bs[i].Key, fmt.Sprint(now), "decided"},
					[]string{"PEXPIREAT", bs[i].Key, fmt.Sprint(now/1000 + c.width + 1)})
			case 1: // an old decision, its key expiring before the replay's units leave
				setup = append(setup, []string{"ZADD", bs[i].Key, fmt.Sprint(now - c.width*1000 + 5_000_000), "old"},
					[]string{"PEXPIREAT", bs[i].Key, fmt.Sprint(now/1000 + 5_000)})
			}
		}
		if way == "p:" {
			c.plain = bs
		} else {
			c.scripts = bs
		}
	}
	for i, err := range store.(driver.Commander).RunCommands(context.Background(), setup) {
		if err != nil {
			t.Fatalf("setup %v: %v", setup[i], err)
		}
	}
	for i, err := range reconcile.New(reconcile.Options{FreshMin: -1, CallTimeout: 10 * time.Second}).Reconcile(context.Background(), store, c.scripts) {
		if err != nil {
			t.Fatalf("scripts batch %d: %v", i, err)
		}
	}
	return c
}

// check compares every plain key with its script twin: the same members
// and scores, and an expiry no earlier (give or take a script's run) and
// at most slack later.
func (c *plainCase) check(t *testing.T, slack time.Duration) {
	t.Helper()
	// The keys of every kind (i % 4), on both sides of the slices.
	for i := 0; i < len(c.plain); i += 1 + i%13 {
		pk, sk := c.plain[i].Key, c.scripts[i].Key
		// The grant ids are the way's: p:… and s:….
		if got, want := strings.ReplaceAll(window(t, c.srv, pk), "[p:", "[s:"), window(t, c.srv, sk); got != want {
			t.Fatalf("batch %d: plain key %s, the scripts' %s", i, got, want)
		}
		pt, st := expiry(t, c.srv, pk), expiry(t, c.srv, sk)
		// A script computes its TTL from the Redis time at its start,
		// and Redis applies it when the script reaches its PEXPIRE: a
		// call of many batches ends the keys it writes a few ms apart.
		if pt < st-50 || pt > st+slack.Milliseconds() {
			t.Fatalf("batch %d: plain key expires at %d, the scripts' at %d", i, pt, st)
		}
	}
}

// TestPlainWrites: a replay of window batches without seed units writes
// them with plain commands (no script, no marker) and leaves each key as
// the replay script does, onto missing keys, live keys and keys about to
// expire. Replies lost, a batch's commands cut short, and a replay sent
// again each leave every unit counted once.
func TestPlainWrites(t *testing.T) {
	t.Parallel()
	const n = 1500 // two slices
	t.Run("replies_lost", func(t *testing.T) {
		t.Parallel()
		c := newPlainCase(t, n)
		start := time.Now()
		crash := &crashAfter{Store: c.store, fail: 1}
		rec := &recording{Store: crash}
		r := reconcile.New(reconcile.Options{FreshMin: 1, CallTimeout: 10 * time.Second})
		lost := 0
		for _, err := range r.Reconcile(context.Background(), rec, c.plain) {
			if errors.Is(err, errCrash) {
				lost++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		// One of the two slices' RunCommands lost its replies: its
		// batches stay in the log.
		if lost == 0 || lost == n {
			t.Fatalf("%d of %d batches lost, want one slice's", lost, n)
		}
		for attempt := range 2 {
			for i, err := range r.Reconcile(context.Background(), rec, c.plain) {
				if err != nil {
					t.Fatalf("retry %d batch %d: %v", attempt, i, err)
				}
			}
		}
		if rec.plain != 3*n || len(rec.sizes) != 0 {
			t.Fatalf("%d plain writes, calls of %v batches; want %d and no calls", rec.plain, rec.sizes, 3*n)
		}
		c.check(t, time.Since(start))
	})
	t.Run("cut_short", func(t *testing.T) {
		t.Parallel()
		c := newPlainCase(t, n)
		start := time.Now()
		// Each batch's last command (PEXPIRE NX) is not sent: its key may
		// be left without a TTL until the batch is sent again.
		cut := &cutShort{Store: c.store, drop: "NX"}
		r := reconcile.New(reconcile.Options{FreshMin: 1, CallTimeout: 10 * time.Second})
		for _, err := range r.Reconcile(context.Background(), cut, c.plain) {
			var se *core.StoreError
			if !errors.As(err, &se) || se.Answered {
				t.Fatalf("cut short: %v, want an unanswered store error", err)
			}
		}
		if e := expiry(t, c.srv, c.plain[2].Key); e != -1 {
			t.Fatalf("a new key cut short expires at %d, want never", e)
		}
		for i, err := range r.Reconcile(context.Background(), c.store, c.plain) {
			if err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
		}
		c.check(t, time.Since(start))
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		c := newPlainCase(t, 8*1024)
		start := time.Now()
		// Redis refuses PEXPIRE … NX (a server or ACL without it): the
		// batches go to the replay scripts, and once most of a slice's
		// did, later slices go there at once.
		cut := &cutShort{Store: c.store, drop: "NX", answered: true}
		rec := &recording{Store: cut}
		for i, err := range reconcile.New(reconcile.Options{FreshMin: 1, CallTimeout: 10 * time.Second}).Reconcile(context.Background(), rec, c.plain) {
			if err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
		}
		// At most the slices in flight when the first one's replies
		// came back: 4 of 1024 batches each, and the one built then.
		if rec.plain == 0 || rec.plain > 5*1024 {
			t.Fatalf("%d of %d batches sent plain, want some and at most %d", rec.plain, len(c.plain), 5*1024)
		}
		c.check(t, time.Since(start))
	})
}

// TestPlainKeepsSeeds: a batch with seed units and one without, on one
// key that Redis lost, replayed together: the seed goes into the missing
// key, as the replay scripts alone write it. Had the plain batch created
// the key first, the seed would be skipped.
func TestPlainKeepsSeeds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := newStore(t, srv)
	p, _ := slidingwindow.Policy("ksw", 100, 10*time.Second)
	now := redisNow(t, srv)
	for _, way := range []struct {
		name     string
		freshMin int
	}{{"plain", 1}, {"scripts", -1}} {
		key := driver.StorageKey("hf:", p.Name(), way.name)
		bs := []driver.Batch{
			{ID: way.name + ":e:1", Key: key, Policy: p, Seed: driver.Seed{Value: 5, At: now - 3_000_000},
				Grants: []driver.Grant{{ID: way.name + "b", Cost: 1, At: now - 1_000_000}}},
			{ID: way.name + ":e:2", Key: key, Policy: p, Grants: []driver.Grant{{ID: way.name + "a", Cost: 2, At: now - 2_000_000}}},
		}
		rec := &recording{Store: store}
		for i, err := range reconcile.New(reconcile.Options{FreshMin: way.freshMin}).Reconcile(context.Background(), rec, bs) {
			if err != nil {
				t.Fatalf("%s batch %d: %v", way.name, i, err)
			}
		}
		if n := srv.Do(t, "ZCARD", key); n != "8" {
			t.Errorf("%s: ZCARD %s, want 8 (5 seed units, a, a#1, b)", way.name, n)
		}
		if rec.plain != 0 {
			t.Errorf("%s: %d plain writes, want none: the key is the seeded batch's", way.name, rec.plain)
		}
	}
}

// cutShort is a Commander that does not send the commands with the word
// drop: it reports each failed, not answered (lost on the way), or
// answered (refused).
type cutShort struct {
	driver.Store
	drop     string
	answered bool
	mu       sync.Mutex
}

func (c *cutShort) RunCommands(ctx context.Context, cmds [][]string) []error {
	var send [][]string
	var at []int
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		if strings.Join(cmd, " ") != "" && cmd[len(cmd)-1] == c.drop {
			errs[i] = &core.StoreError{Class: core.ClassUnavailable, Reason: "cut", Answered: c.answered, Err: errors.New("not sent")}
			if c.answered {
				errs[i] = &core.StoreError{Class: core.ClassUnknown, Reason: "refused", Answered: true, Err: errors.New("ERR syntax error")}
			}
			continue
		}
		send, at = append(send, cmd), append(at, i)
	}
	for j, err := range c.Store.(driver.Commander).RunCommands(ctx, send) {
		errs[at[j]] = err
	}
	return errs
}
