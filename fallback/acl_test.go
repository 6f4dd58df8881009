package fallback_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/algorithms/slidingwindow"
	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
	"github.com/holdfast/holdfast/internal/redistest"
)

// ACL is the Redis ACL rule holdfast needs with the default key prefix
// "hf:": its keys only, and the commands its scripts, probes and pipelines
// run (the README quotes it).
const ACL = "on >s3cret resetkeys ~hf:* resetchannels -@all " +
	"+hello +auth +ping +eval +evalsha +script|load " +
	"+time +hmget +pexpire +zremrangebyscore +zcard +zrange +zadd +zrem +set +get +hset +pttl +del +exists"

// TestACLUser runs the whole fallback path — decisions, membership, an
// outage, replay, the recovery barrier — as a Redis user allowed only the
// holdfast prefix and the commands above, on both backends; the same user
// cannot read a key outside the prefix.
func TestACLUser(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"goredis", "rueidis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.WithAOF(), redistest.WithArgs(append([]string{"--user", "holdfast"}, strings.Fields(ACL)...)...))
			url := "redis://holdfast:s3cret@" + srv.Addr() + "/0"
			in := startInstances(t, backend, url, 2, "")
			tb, _ := tokenbucket.Policy("tb", 4, 0.001)
			sw, _ := slidingwindow.Policy("sw", 4, time.Minute)
			ctx := context.Background()
			for _, p := range []core.Policy{tb, sw} {
				for i := range 6 {
					r, err := in.lims[i%2].Allow(ctx, p, "acl")
					if err != nil {
						t.Fatalf("%s request %d: %v", p.Name(), i, err)
					}
					if r.Mode != core.ModeRedis || r.Allowed != (i < 4) {
						t.Fatalf("%s request %d: %+v", p.Name(), i, r)
					}
				}
			}
			// Peek, AllowAll's refund and Reset run as the user too.
			if rs, err := in.lims[0].AllowAll(ctx, core.Request{Policy: sw, Key: "acl-ops"}, core.Request{Policy: tb, Key: "acl"}); err != nil || core.Denied(rs) != 1 {
				t.Fatalf("AllowAll past tb's limit: %+v %v", rs, err)
			}
			if r, err := in.lims[1].Peek(ctx, sw, "acl-ops", 4); err != nil || !r.Allowed || r.Mode != core.ModeRedis {
				t.Fatalf("sw after the refund: %+v %v, want all 4 left", r, err)
			}
			if err := in.lims[1].Reset(ctx, tb, "acl"); err != nil {
				t.Fatal(err)
			}
			if r, err := in.lims[0].Peek(ctx, tb, "acl", 4); err != nil || !r.Allowed || r.Mode != core.ModeRedis {
				t.Fatalf("tb after Reset: %+v %v, want a full bucket", r, err)
			}
			srv.Kill()
			for i := range 20 {
				for _, p := range []core.Policy{tb, sw} { // both replays run as the user
					// Several keys, so that replay calls carry several
					// batches (their markers, the EXISTS of their keys).
					if _, err := in.lims[i%2].Allow(ctx, p, "acl-outage-"+strconv.Itoa(i%10)); err != nil {
						t.Fatal(err)
					}
				}
			}
			srv.Restart(t)
			in.checkRecovered(t)
			// Nothing the user ran was refused (a script's refused command
			// that it tolerates shows only here).
			if log := srv.Do(t, "ACL", "LOG"); log != "[]" {
				t.Fatalf("ACL LOG after the recovery: %s", log)
			}
			// The user's reach ends at the prefix.
			store := newStore(t, backend, url)
			_, err := store.Run(ctx, driver.NewScript("peek", "return redis.call('GET', KEYS[1])", nil), []string{"other:key"}, nil)
			if core.ClassOf(err) != core.ClassUnavailable || core.ReasonOf(err) != "NOPERM" {
				t.Fatalf("reading outside the prefix: %v, want a NOPERM refusal", err)
			}
		})
	}
}
